// Package server is the kubelet-facing transport of the device plugin: it serves the
// device-plugin API v1beta1 on a unix socket, registers the resource with kubelet, keeps the
// registration alive across kubelet restarts and hands each container's Allocate to an
// Allocator.
package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Allocator realises one container's devices. It is called once per container request of
// an AllocateRequest; its error fails the whole Allocate and its text is what kubelet shows
// on the pod.
type Allocator interface {
	Allocate(ctx context.Context, req *pluginapi.ContainerAllocateRequest) (*pluginapi.ContainerAllocateResponse, error)
}

// PreStarter prepares a container's devices just before the kubelet creates the container
// (every start, restarts included). With one, the plugin registers with PreStartRequired.
type PreStarter interface {
	PreStartContainer(ctx context.Context, deviceIDs []string) error
}

// Options configure a Server.
type Options struct {
	// ResourceName is the extended resource to register, e.g. nvidia.com/gpu.
	ResourceName string
	// SocketDir holds kubelet.sock and our socket; default pluginapi.DevicePluginPath.
	SocketDir string
	// Endpoint is our socket's file name in SocketDir; default "dynamig-<resource>.sock"
	// with every character outside [A-Za-z0-9._-] replaced by '-'.
	Endpoint string
	// Devices returns the devices to advertise now.
	Devices func() []*pluginapi.Device
	// Changed receives a value whenever Devices() changed; nil means never.
	Changed <-chan struct{}
	// Allocator handles Allocate.
	Allocator Allocator
	// PreStarter, if set, handles PreStartContainer; a failure keeps the kubelet from
	// creating the container (it retries with backoff).
	PreStarter PreStarter
	// RegisterRetry is the first delay after a failed registration; it doubles up to
	// maxRegisterRetry. Default 1s.
	RegisterRetry time.Duration
}

const (
	defaultRegisterRetry = time.Second
	maxRegisterRetry     = 30 * time.Second
	registerTimeout      = 10 * time.Second
	// maxSocketPath is the room in sockaddr_un.sun_path, less the terminating NUL.
	maxSocketPath = 107
)

// Server is the device-plugin gRPC server for one resource.
type Server struct {
	opts          Options
	socketPath    string
	kubeletSocket string
	// pollInterval is how often Run checks both sockets; tests shorten it.
	pollInterval time.Duration

	mu sync.Mutex
	// changed is closed (and replaced) whenever Devices() may have changed, waking every
	// ListAndWatch stream.
	changed chan struct{}
	// stopped is closed when Run ends, ending every ListAndWatch stream.
	stopped chan struct{}
	ran     atomic.Bool
	// registered: the kubelet we last registered with took us (Registered).
	registered atomic.Bool
}

// Registered says whether the plugin is registered with the running kubelet: false before
// the first registration and from when the socket or the kubelet is found replaced until
// registration succeeds again.
func (s *Server) Registered() bool { return s.registered.Load() }

// New validates opts, fills in defaults and returns a Server ready to Run.
func New(opts Options) (*Server, error) {
	if opts.ResourceName == "" {
		return nil, errors.New("Options.ResourceName is required")
	}
	if err := validateResourceName(opts.ResourceName); err != nil {
		return nil, fmt.Errorf("Options.ResourceName %q: %w", opts.ResourceName, err)
	}
	if opts.SocketDir == "" {
		opts.SocketDir = pluginapi.DevicePluginPath
	}
	dir, err := filepath.Abs(opts.SocketDir)
	if err != nil {
		return nil, fmt.Errorf("Options.SocketDir %q: %w", opts.SocketDir, err)
	}
	opts.SocketDir = dir
	if opts.Endpoint == "" {
		opts.Endpoint = "dynamig-" + sanitise(opts.ResourceName) + ".sock"
	}
	if opts.Endpoint != filepath.Base(opts.Endpoint) || opts.Endpoint == "." || opts.Endpoint == ".." {
		return nil, fmt.Errorf("Options.Endpoint %q must be a file name in Options.SocketDir, without '/'", opts.Endpoint)
	}
	if opts.Endpoint == "kubelet.sock" {
		return nil, errors.New(`Options.Endpoint must not be "kubelet.sock": that is kubelet's own socket`)
	}
	if opts.Devices == nil {
		return nil, errors.New("Options.Devices is required")
	}
	if opts.Allocator == nil {
		return nil, errors.New("Options.Allocator is required")
	}
	if opts.RegisterRetry < 0 {
		return nil, fmt.Errorf("Options.RegisterRetry must not be negative, got %v", opts.RegisterRetry)
	}
	if opts.RegisterRetry == 0 {
		opts.RegisterRetry = defaultRegisterRetry
	}
	s := &Server{
		opts:          opts,
		socketPath:    filepath.Join(dir, opts.Endpoint),
		kubeletSocket: filepath.Join(dir, "kubelet.sock"),
		pollInterval:  500 * time.Millisecond,
		changed:       make(chan struct{}),
		stopped:       make(chan struct{}),
	}
	for _, p := range []string{s.socketPath, s.kubeletSocket} {
		if len(p) > maxSocketPath {
			return nil, fmt.Errorf("Options.SocketDir/Endpoint: socket path %q is %d bytes, over the unix socket limit of %d", p, len(p), maxSocketPath)
		}
	}
	return s, nil
}

// SocketPath is the path of the socket the server listens on.
func (s *Server) SocketPath() string { return s.socketPath }

// validateResourceName accepts what kubelet's registration accepts: a domain-qualified
// name outside kubernetes.io (v1helper.IsExtendedResourceName).
func validateResourceName(name string) error {
	if !strings.Contains(name, "/") {
		return errors.New("must be domain-qualified, like example.com/gpu")
	}
	if strings.HasPrefix(name, "requests.") {
		return errors.New(`must not start with "requests."`)
	}
	domain := name[:strings.Index(name, "/")]
	if domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") {
		return errors.New("must not be in the kubernetes.io domain")
	}
	if errs := validation.IsQualifiedName(name); len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

func sanitise(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '-'
	}, name)
}

// Run serves and registers until ctx ends, then stops gRPC and removes the socket. It
// recreates the socket and registers again when the socket disappears (kubelet deletes
// plugin sockets when it starts) or kubelet.sock is replaced (kubelet restarted). A Server
// runs once.
func (s *Server) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("device plugin server: Run called twice")
	}
	logger := klog.FromContext(ctx).WithValues("resource", s.opts.ResourceName, "socket", s.socketPath)
	ctx = klog.NewContext(ctx, logger)
	defer close(s.stopped)

	if s.opts.Changed != nil {
		go s.forwardChanges(ctx)
	}

	var (
		l          *listener
		registered bool
		kubeletID  fs.FileInfo // kubelet.sock as it was at the last registration attempt
		nextTry    time.Time
		delay      = s.opts.RegisterRetry
		first      = true
	)
	defer func() {
		s.registered.Store(false)
		if l != nil {
			l.stop()
		}
		logger.Info("Device plugin server stopped")
	}()

	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}

		if l == nil || !l.intact() {
			if l != nil {
				logger.Info("Plugin socket was removed (kubelet restarted?); serving it again")
				l.stop()
				l = nil
			}
			var err error
			if l, err = s.listen(ctx); err != nil {
				if first {
					return err // a setup problem: say so at once
				}
				logger.Error(err, "Serving the plugin socket again failed; will retry")
				timer.Reset(s.pollInterval)
				continue
			}
			registered, nextTry, delay = false, time.Time{}, s.opts.RegisterRetry
		}
		first = false

		kubelet, _ := os.Stat(s.kubeletSocket)
		if registered && (kubelet == nil || !os.SameFile(kubelet, kubeletID)) {
			// kubelet restarted without (yet) deleting our socket: its new instance
			// knows nothing of us.
			logger.Info("kubelet socket changed or went away; registering again")
			registered, nextTry, delay = false, time.Time{}, s.opts.RegisterRetry
		}
		if !registered && kubelet != nil && (kubeletID == nil || !os.SameFile(kubelet, kubeletID)) {
			// A new kubelet is up: don't wait out the backoff.
			nextTry = time.Time{}
		}

		wait := s.pollInterval
		if !registered {
			if now := time.Now(); !now.Before(nextTry) {
				if err := s.register(ctx); err != nil {
					logger.Error(err, "Registering with kubelet failed; will retry", "retryIn", delay)
					nextTry = now.Add(delay)
					delay = min(2*delay, max(maxRegisterRetry, s.opts.RegisterRetry))
				} else {
					logger.Info("Registered with kubelet")
					registered, delay = true, s.opts.RegisterRetry
				}
				// Remember the kubelet we tried, so a new one is noticed either way.
				kubeletID = kubelet
			}
			if !registered {
				wait = min(wait, max(time.Until(nextTry), 0))
			}
		}
		s.registered.Store(registered)
		timer.Reset(wait)
	}
}

// forwardChanges turns each Changed value into a wake-up of every ListAndWatch stream.
func (s *Server) forwardChanges(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-s.opts.Changed:
			if !ok {
				return
			}
			s.mu.Lock()
			close(s.changed)
			s.changed = make(chan struct{})
			s.mu.Unlock()
		}
	}
}

func (s *Server) changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// listener is one incarnation of our socket and the gRPC server on it.
type listener struct {
	path string
	info fs.FileInfo
	grpc *grpc.Server
	done chan struct{}
}

func (s *Server) listen(ctx context.Context) (*listener, error) {
	if err := os.Remove(s.socketPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("removing stale socket: %w", err)
	}
	ln, err := net.Listen("unix", s.socketPath)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", s.socketPath, err)
	}
	// We remove the file ourselves, and only if it is still ours.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	info, err := os.Stat(s.socketPath)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("stat %s: %w", s.socketPath, err)
	}
	g := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(g, &service{s: s, logger: klog.FromContext(ctx)})
	l := &listener{path: s.socketPath, info: info, grpc: g, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		if err := g.Serve(ln); err != nil {
			klog.FromContext(ctx).Error(err, "Device plugin gRPC server ended")
		}
	}()
	klog.FromContext(ctx).V(2).Info("Serving device plugin API")
	return l, nil
}

// intact says whether our socket file is still the one we listen on.
func (l *listener) intact() bool {
	info, err := os.Stat(l.path)
	return err == nil && os.SameFile(info, l.info)
}

func (l *listener) stop() {
	l.grpc.Stop()
	<-l.done
	if l.intact() {
		_ = os.Remove(l.path)
	}
}

func (s *Server) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+s.kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connecting to kubelet at %s: %w", s.kubeletSocket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     s.opts.Endpoint,
		ResourceName: s.opts.ResourceName,
		Options:      s.pluginOptions(),
	})
	if err != nil {
		return fmt.Errorf("registering %s with kubelet at %s: %w", s.opts.ResourceName, s.kubeletSocket, err)
	}
	return nil
}

func (s *Server) pluginOptions() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{PreStartRequired: s.opts.PreStarter != nil, GetPreferredAllocationAvailable: false}
}

// service implements the DevicePlugin gRPC service.
type service struct {
	pluginapi.UnimplementedDevicePluginServer
	s      *Server
	logger klog.Logger
}

func (v *service) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return v.s.pluginOptions(), nil
}

func (v *service) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		// Take the channel before reading Devices() so a change in between is not lost.
		changed := v.s.changes()
		devs := v.s.opts.Devices()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		v.logger.V(4).Info("Sent devices to kubelet", "count", len(devs))
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		case <-v.s.stopped:
			return nil
		}
	}
}

func (v *service) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	// kubelet never calls this (GetPreferredAllocationAvailable is false); answer "no
	// preference" for each container if something does.
	resp := &pluginapi.PreferredAllocationResponse{}
	for range req.GetContainerRequests() {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{})
	}
	return resp, nil
}

func (v *service) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	ctx = klog.NewContext(ctx, v.logger)
	resp := &pluginapi.AllocateResponse{}
	for _, creq := range req.GetContainerRequests() {
		v.logger.V(2).Info("Allocate", "devices", creq.GetDevicesIds())
		cresp, err := v.s.opts.Allocator.Allocate(ctx, creq)
		if err != nil {
			v.logger.Error(err, "Allocate failed", "devices", creq.GetDevicesIds())
			if _, ok := status.FromError(err); ok {
				return nil, err
			}
			return nil, status.Error(codes.Unknown, err.Error())
		}
		if cresp == nil {
			cresp = &pluginapi.ContainerAllocateResponse{}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

func (v *service) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	if v.s.opts.PreStarter == nil {
		return &pluginapi.PreStartContainerResponse{}, nil
	}
	if err := v.s.opts.PreStarter.PreStartContainer(ctx, req.GetDevicesIds()); err != nil {
		return nil, err
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}

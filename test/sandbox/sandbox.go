// Package sandbox runs a whole dynamig cluster in one process, for cmd/dynamig-sandbox and
// for tests: an embedded etcd and the real kube-apiserver (test/cluster, admission with
// ValidatingAdmissionPolicy), the shipped manifest (manifests/install.yaml) applied to it
// with server-side apply, the real dynamig-scheduler from the manifest's
// KubeSchedulerConfiguration, dynamig-webhook, and per simulated node a Node object, the
// real `dynamig-device-plugin run` on simulated NVML, and the real kubelet
// (test/kubeletnode) on a fake container runtime that resolves each container's CDI devices
// as containerd does; containers run until their pod is deleted or FinishPod ends them.
//
// The scheduler, the webhook and every device plugin run as the manifest's service accounts,
// with exactly its RBAC and admission policies: each authenticates with a token the API
// server issued for its workload's pod (made from the Deployment's or DaemonSet's template,
// bound to a node, run by that node's kubelet), so a device plugin's requests carry its node.
// Each node's kubelet is system:node:<name>, and the kubeconfig the sandbox writes is
// test/cluster's UserAdmin.
package sandbox

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/freeport"
	"github.com/dynamig/dynamig/test/kubeletnode"
	"github.com/dynamig/dynamig/test/sandbox/sandboxconfig"
	dynamigwebhook "github.com/dynamig/dynamig/webhook"
)

// Options configure a sandbox.
type Options struct {
	// Config is the world to simulate; see DefaultConfig.
	Config sandboxconfig.Config
	// Install is the manifest to install (DefaultInstall, manifests/install.yaml, relative to
	// the repository root, when ""). Its device ConfigMap is given the sandbox's device
	// config, and its webhook configuration the in-process webhook's URL.
	Install string
	// Log receives the API server's and the device plugins' command output; nil discards
	// it. (Components logging through klog log wherever the process configured klog.)
	Log io.Writer
	// ReadyTimeout bounds the start; 0 is two minutes.
	ReadyTimeout time.Duration
	// CreateLatency is every simulated GPU's GPU-instance create time (sim.Options): creates
	// on one GPU take turns, on different GPUs they overlap. 0: instant.
	CreateLatency time.Duration
	// Kubelet is the kubelet binary the nodes run; "" is kubeletnode.Binary() ($DYNAMIG_KUBELET,
	// else built from the module).
	Kubelet string
	// Controllers starts kube-controller-manager (cluster.Options.Controllers): pass
	// controllermanager.Start for a sandbox where Deployments, Jobs and DaemonSets make pods,
	// node lifecycle runs and pods get service-account tokens. nil: none, as the fast suites run.
	Controllers func(ctx context.Context, cp *cluster.ControlPlane) (stop func(), err error)
	// APIServerFlags are more kube-apiserver flags: the cluster's own configuration, such as
	// the feature gates and API groups of the Workload API (test/gang). The scheduler takes
	// its flags from the manifest (its Deployment's --feature-gates); both run in this
	// process, whose feature gates are one set.
	APIServerFlags []string
}

// Sandbox is a running in-process cluster.
type Sandbox struct {
	cp           *cluster.ControlPlane
	admin        kubernetes.Interface
	dir          string // the sandbox's own temporary directory (device config)
	deviceConfig string
	devCfg       *config.DeviceConfig
	log          io.Writer
	// createLatency is Options.CreateLatency, for the nodes' simulators.
	createLatency time.Duration
	// controllers: kube-controller-manager runs (Options.Controllers), so the device plugins'
	// pods are their DaemonSet's (daemonPodIdentity).
	controllers bool

	schedulerStop    func()
	schedulerMetrics string
	webhookDone      chan struct{} // closed when the webhook has exited (Stop)
	metricsServer    *http.Server
	metricsDone      chan struct{}

	nodes []*node

	install *install
	// schedulerConfig is the manifest's KubeSchedulerConfiguration, and schedulerKubeconfig
	// the scheduler's identity.
	schedulerConfig     string
	schedulerKubeconfig string

	// ctx lives until Stop: the components run under it.
	ctx      context.Context
	cancel   context.CancelFunc
	stopOnce sync.Once
}

// NodeInfo describes a running simulated node.
type NodeInfo struct {
	Name string `json:"-"`
	// DeviceMetrics is the node's device plugin /metrics URL.
	DeviceMetrics string   `json:"deviceMetrics"`
	Mode          string   `json:"mode"`
	GPUs          []string `json:"gpus"`
	// GPUUUIDs are the simulated GPUs' UUIDs, from the node's published inventory.
	GPUUUIDs []string `json:"gpuUUIDs"`
}

// Start starts the control plane, applies the install manifest, starts the nodes, the
// webhook and the scheduler, and returns once every node's device plugin has registered its
// devices with the node's kubelet, published its inventory and heartbeat, and the Node
// advertises the devices. ctx bounds the start only; call Stop to shut everything down.
func Start(ctx context.Context, opts Options) (_ *Sandbox, err error) {
	if err := opts.Config.Validate(); err != nil {
		return nil, err
	}
	if opts.Install == "" {
		opts.Install = DefaultInstall
	}
	timeout := opts.ReadyTimeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancelStart := context.WithTimeout(ctx, timeout)
	defer cancelStart()
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	s := &Sandbox{log: log, createLatency: opts.CreateLatency, controllers: opts.Controllers != nil}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	devCfg, devCfgYAML, err := opts.Config.DeviceConfigYAML()
	if err != nil {
		return nil, err
	}
	s.devCfg = devCfg
	if s.dir, err = os.MkdirTemp("", "dynamig-sandbox-"); err != nil {
		return nil, err
	}
	s.deviceConfig = filepath.Join(s.dir, "device-config.yaml")
	if err := os.WriteFile(s.deviceConfig, devCfgYAML, 0o600); err != nil {
		return nil, err
	}
	webhookAddr, err := freeAddress()
	if err != nil {
		return nil, err
	}
	_, webhookPort, _ := net.SplitHostPort(webhookAddr)
	if s.install, err = readInstall(opts.Install, devCfgYAML, "https://localhost:"+webhookPort+dynamigwebhook.Path); err != nil {
		return nil, fmt.Errorf("install: %w", err)
	}
	s.schedulerConfig = filepath.Join(s.dir, "scheduler-config.yaml")
	if err := os.WriteFile(s.schedulerConfig, []byte(s.install.schedulerConfig), 0o600); err != nil {
		return nil, err
	}

	users := map[string][]string{}
	for _, n := range opts.Config.Nodes {
		users[nodeUser(n.Name)] = []string{"system:masters", "system:nodes"}
	}
	if s.cp, err = cluster.StartProcess(ctx, cluster.Options{Users: users, Log: log, Controllers: opts.Controllers, APIServerFlags: opts.APIServerFlags}); err != nil {
		return nil, err
	}
	if s.admin, err = s.cp.Client(cluster.UserAdmin); err != nil {
		return nil, err
	}
	if err := s.apply(ctx, s.install); err != nil {
		return nil, fmt.Errorf("install %s: %w", opts.Install, err)
	}

	kubelet := opts.Kubelet
	if kubelet == "" {
		if kubelet, err = kubeletnode.Binary(); err != nil {
			return nil, err
		}
	}
	if err := kubeletnode.CheckIsolation(); err != nil {
		return nil, err
	}
	daemonSet, err := s.install.workload("DaemonSet", devicePluginWorkload)
	if err != nil {
		return nil, err
	}
	// Nodes, one at a time: each is ready (devices registered, inventory published) before
	// the next starts.
	for _, nc := range opts.Config.Nodes {
		n, err := s.newNode(nc)
		s.nodes = append(s.nodes, n)
		if err != nil {
			return nil, err
		}
	}
	for _, nc := range opts.Config.Nodes {
		n := s.node(nc.Name)
		if err := n.start(ctx, kubelet, daemonSet); err != nil {
			return nil, fmt.Errorf("node %s: %w", nc.Name, err)
		}
		if err := n.waitReady(ctx); err != nil {
			return nil, fmt.Errorf("node %s: %w", nc.Name, err)
		}
	}

	// The webhook and the scheduler, their pods on the first node.
	first := opts.Config.Nodes[0].Name
	if err := s.startWebhook(ctx, webhookAddr, first); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	deployment, err := s.install.workload("Deployment", schedulerWorkload)
	if err != nil {
		return nil, err
	}
	if s.schedulerKubeconfig, err = s.identity(ctx, deployment, first, withoutProbes); err != nil {
		return nil, err
	}
	if err := s.startScheduler(); err != nil {
		return nil, err
	}
	return s, nil
}

// freeAddress is a free 127.0.0.1 port, as host:port (freeport.Port).
func freeAddress() (string, error) {
	port, err := freeport.Port()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

func nodeUser(node string) string { return "system:node:" + node }

func (s *Sandbox) node(name string) *node {
	for _, n := range s.nodes {
		if n.cfg.Name == name {
			return n
		}
	}
	return nil
}

// FirstInstanceCreate is when node's device plugin first asked NVML to create a GPU
// instance (zero before it has).
func (s *Sandbox) FirstInstanceCreate(node string) time.Time {
	if n := s.node(node); n != nil {
		return n.gpus.FirstCreate()
	}
	return time.Time{}
}

// RestartDevicePlugin stops node's device plugin and starts a new one on the same simulated
// GPUs (their MIG instances stay, as on real hardware), and waits until it has registered
// with the node's kubelet again.
func (s *Sandbox) RestartDevicePlugin(ctx context.Context, node string) error {
	n := s.node(node)
	if n == nil {
		return fmt.Errorf("no sandbox node %q", node)
	}
	return n.restartDevicePlugin(ctx)
}

// ContainerEnv is the environment the runtime resolved for the newest container of that
// name in the pod (the kubelet's variables and the CDI specs' edits): what the process
// would see.
func (s *Sandbox) ContainerEnv(ctx context.Context, namespace, pod, container string) (map[string]string, error) {
	p, err := s.admin.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	c, ok := s.Container(p.Spec.NodeName, p.UID, container)
	if !ok {
		return nil, fmt.Errorf("no container %s of pod %s/%s was created on node %q", container, namespace, pod, p.Spec.NodeName)
	}
	return c.Env, nil
}

// Container is the newest container the node's runtime created for the pod's container:
// its CDI devices, resolved environment and attempt.
func (s *Sandbox) Container(node string, pod types.UID, container string) (kubeletnode.Container, bool) {
	n := s.node(node)
	if n == nil {
		return kubeletnode.Container{}, false
	}
	return n.kubelet.Runtime.Latest(pod, container)
}

// RestartKubelet stops node's kubelet and starts it again on the same directories and
// runtime (its containers keep running, as on a real node), and waits until the Node is
// Ready and advertises the device plugin's devices again: the kubelet deletes every socket
// in the device-plugin directory on start, and the plugin must register again.
func (s *Sandbox) RestartKubelet(ctx context.Context, node string) error {
	n := s.node(node)
	if n == nil {
		return fmt.Errorf("no sandbox node %q", node)
	}
	return n.restartKubelet(ctx)
}

// RebootNode simulates a reboot of node while its pods stay bound: the kubelet and the
// device plugin stop, every MIG instance is lost (instances do not survive a reboot), the
// volatile CDI spec directory is emptied and the runtime forgets its sandboxes and
// containers; then the kubelet and the device plugin start again, and it waits until the
// Node is Ready with its devices. The pods' containers come back as the kubelet starts them.
func (s *Sandbox) RebootNode(ctx context.Context, node string) error {
	n := s.node(node)
	if n == nil {
		return fmt.Errorf("no sandbox node %q", node)
	}
	return n.reboot(ctx)
}

// RestartScheduler stops the scheduler and starts a new one, with an empty cache.
func (s *Sandbox) RestartScheduler(ctx context.Context) error {
	s.schedulerStop()
	s.schedulerStop = nil
	return s.runScheduler()
}

// runScheduler starts dynamig-scheduler on the manifest's configuration, as the scheduler's
// service account, with the sandbox's device config.
func (s *Sandbox) runScheduler() error {
	file, err := s.cp.SchedulerConfigAs(s.schedulerConfig, s.schedulerKubeconfig, cluster.DeviceConfigFile(s.deviceConfig))
	if err != nil {
		return fmt.Errorf("scheduler config: %w", err)
	}
	stop, err := cluster.StartScheduler(s.ctx, s.cp, file, s.install.schedulerFlags...)
	if err != nil {
		return err
	}
	s.schedulerStop = stop
	return nil
}

// startScheduler runs the scheduler, with its DynamicMIG metrics on a port of its own.
func (s *Sandbox) startScheduler() error {
	if err := s.runScheduler(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s.schedulerMetrics = "http://" + ln.Addr().String() + "/metrics"
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(dynamicmig.Registry, promhttp.HandlerOpts{}))
	s.metricsServer = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	s.metricsDone = make(chan struct{})
	go func() {
		defer close(s.metricsDone)
		_ = s.metricsServer.Serve(ln)
	}()
	return nil
}

// Stop shuts everything down, last started first, and removes every file the sandbox
// wrote. It is idempotent.
func (s *Sandbox) Stop() {
	s.stopOnce.Do(func() {
		if s.schedulerStop != nil {
			s.schedulerStop()
		}
		if s.metricsServer != nil {
			shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = s.metricsServer.Shutdown(shutdown)
			cancel()
			<-s.metricsDone
		}
		s.cancel()
		if s.webhookDone != nil {
			<-s.webhookDone
		}
		var wg sync.WaitGroup
		for _, n := range s.nodes {
			wg.Add(1)
			go func() { defer wg.Done(); n.stop() }()
		}
		wg.Wait()
		if s.cp != nil {
			s.cp.Stop()
		}
		if s.dir != "" {
			_ = os.RemoveAll(s.dir)
		}
	})
}

// Client is a clientset of the admin identity (cluster.UserAdmin).
func (s *Sandbox) Client() kubernetes.Interface { return s.admin }

// RestConfig is the admin identity's client config.
func (s *Sandbox) RestConfig() *rest.Config { return rest.CopyConfig(s.cp.Config) }

// Kubeconfig is the path of a kubeconfig of the admin identity (removed by Stop).
func (s *Sandbox) Kubeconfig() string { return s.cp.Kubeconfig }

// APIServer is the API server's URL.
func (s *Sandbox) APIServer() string { return s.cp.Config.Host }

// ControlPlane is the underlying control plane (audit log, other identities).
func (s *Sandbox) ControlPlane() *cluster.ControlPlane { return s.cp }

// SchedulerMetrics is the URL serving the DynamicMIG plugin's metrics.
func (s *Sandbox) SchedulerMetrics() string { return s.schedulerMetrics }

// SchedulerConfigFile is the scheduler's KubeSchedulerConfiguration (the manifest's).
func (s *Sandbox) SchedulerConfigFile() string { return s.schedulerConfig }

// DeviceConfigFile is the device-config.yaml the scheduler and every device plugin use.
func (s *Sandbox) DeviceConfigFile() string { return s.deviceConfig }

// Nodes describes the simulated nodes, in the config's order.
func (s *Sandbox) Nodes() []NodeInfo {
	var out []NodeInfo
	for _, n := range s.nodes {
		out = append(out, n.info())
	}
	return out
}

// State is what `dynamig-sandbox --state-out` writes.
type State struct {
	APIServer        string              `json:"apiserver"`
	Kubeconfig       string              `json:"kubeconfig"`
	SchedulerMetrics string              `json:"schedulerMetrics"`
	Nodes            map[string]NodeInfo `json:"nodes"`
}

// State describes the running sandbox; kubeconfig is the path to report (the caller may
// have copied Kubeconfig elsewhere).
func (s *Sandbox) State(kubeconfig string) State {
	st := State{APIServer: s.APIServer(), Kubeconfig: kubeconfig, SchedulerMetrics: s.schedulerMetrics, Nodes: map[string]NodeInfo{}}
	for _, n := range s.Nodes() {
		st.Nodes[n.Name] = n
	}
	return st
}

// FinishPod makes a running pod's containers exit, with code 0 (succeeded) or 1, as its
// processes ending would; the node's kubelet then sets its status (Succeeded or Failed
// under restartPolicy Never; with Always or OnFailure it restarts them, as a kubelet does)
// and its device plugin reclaims its MIG instances once it has ended.
func (s *Sandbox) FinishPod(ctx context.Context, namespace, name string, succeeded bool) error {
	p, err := s.admin.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	n := s.node(p.Spec.NodeName)
	if n == nil {
		return fmt.Errorf("pod %s/%s is not bound to a sandbox node (nodeName %q)", namespace, name, p.Spec.NodeName)
	}
	return n.finish(p, succeeded)
}

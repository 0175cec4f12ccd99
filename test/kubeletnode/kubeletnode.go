// Package kubeletnode runs a real kubelet (built from the pinned k8s.io/kubernetes) as a test
// node, on Runtime, a fake CRI runtime that resolves CDI devices as containerd does.
//
// The host is left untouched: the kubelet runs in a private mount namespace (unshare -m, or
// unshare -Urm with the KubeletInUserNamespace gate when not root) where the test's own
// directories are bound over /var/lib and /var/log, /run is a tmpfs, and the three sysctls
// it would write are files of the wanted values bound read-only over /proc/sys. Everything
// else (the device plugin, the test) stays outside and reaches the kubelet's sockets at
// their host paths (DevicePluginDir, PodResourcesSocket). Ports are on loopback.
package kubeletnode

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/dynamig/dynamig/test/freeport"
	"github.com/dynamig/dynamig/test/usercache"
	"github.com/dynamig/dynamig/version"
)

// KubeletEnv names the kubelet binary tests use; `make test` builds it into bin/kubelet-<minor>
// and sets it. Without it, Binary builds one.
const KubeletEnv = "DYNAMIG_KUBELET"

// Version is the Kubernetes release this code is built with (the module file's, so one per
// minor of the matrix): the kubelet Binary builds, stamped into it so the Node reports it.
var Version = version.Get().Kubernetes

// Binary returns the kubelet binary: $DYNAMIG_KUBELET, or one built from the module's
// k8s.io/kubernetes/cmd/kubelet tool into the user's cache directory
// (<cache>/dynamig/kubelet-<Version>), once per process: about a minute with a warm build
// cache, a relink when nothing changed.
func Binary() (string, error) { return kubeletBuild.Get() }

var kubeletBuild = &usercache.Build{Env: KubeletEnv, What: "the kubelet",
	Name: func() (string, error) {
		v, err := version.KubernetesRelease()
		return "kubelet-" + v, err
	},
	Check: func(p string) error { _, err := os.Stat(p); return err },
	Make: func(p string) error {
		// Built beside, then renamed: a test process running the kubelet keeps its binary.
		tmp, err := os.CreateTemp(filepath.Dir(p), "kubelet-build-")
		if err != nil {
			return err
		}
		tmp.Close()
		defer os.Remove(tmp.Name())
		v, err := version.KubernetesRelease()
		if err != nil {
			return err
		}
		cmd := exec.Command("go", "build", "-ldflags", "-w "+ldFlags(v), "-o", tmp.Name(), "k8s.io/kubernetes/cmd/kubelet")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%w\n%s", err, out)
		}
		return os.Rename(tmp.Name(), p)
	}}

// ldFlags stamp release v into a kubelet build.
func ldFlags(v string) string {
	major, minor, _ := strings.Cut(strings.TrimPrefix(v, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	const pkg = "k8s.io/component-base/version"
	return fmt.Sprintf("-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s", pkg, v, pkg, major, pkg, minor)
}

// CheckIsolation tells whether this machine can run the kubelet isolated: as root, a
// private mount namespace; otherwise also an unprivileged user namespace. The error says
// plainly what is missing.
func CheckIsolation() error {
	args := []string{"-m", "--propagation", "private", "true"}
	if os.Geteuid() != 0 {
		args = []string{"-Urm", "--propagation", "private", "true"}
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		return errors.New("the kubelet runs in a private mount namespace, made with unshare (util-linux), which is not installed")
	}
	if out, err := exec.Command("unshare", args...).CombinedOutput(); err != nil {
		if os.Geteuid() != 0 {
			return fmt.Errorf("the kubelet runs in a private mount namespace, which a normal user makes inside an unprivileged user namespace, and this machine refuses one (unshare %s: %v: %s); run as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)",
				strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return fmt.Errorf("the kubelet runs in a private mount namespace, and this machine refuses one even to root (unshare %s: %v: %s); in a container, it needs CAP_SYS_ADMIN",
			strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Options configure a Node.
type Options struct {
	// Kubelet is the binary (Binary()).
	Kubelet string
	// Kubeconfig reaches the API server as the node.
	Kubeconfig string
	// NodeName is the Node's name.
	NodeName string
	// Dir holds everything of this node; short (unix socket paths are limited to 108 bytes).
	Dir string
	// Log receives the kubelet's output (nil: discarded).
	Log io.Writer
	// Verbosity is the kubelet's -v (default 1).
	Verbosity int
	// NodeStatusUpdateFrequency (default 2 s).
	NodeStatusUpdateFrequency time.Duration
	// Runtime changes what the node's runtime does with containers (CDI off, image env).
	Runtime RuntimeOptions
	// NodeIP, when set, is the Node's address (--node-ip), where the kubelet serves (the
	// API server's logs and exec): an address of the test's own network namespace
	// (netns.AddLocalAddress). Unset, the kubelet serves on 127.0.0.1 and the Node has no
	// address (the kubelet finds no default route, and refuses a loopback node IP).
	NodeIP string
	// Taints are the Node's at registration (registerWithTaints).
	Taints []v1.Taint
	// Containerd, when set, runs the node on real containerd and runc instead (Runtime is
	// then nil): containerd, its shims and the kubelet share one private mount namespace,
	// the containers' cgroups are under /dynamig-test-<NodeName>-<pid>-<n>, removed by Stop.
	Containerd *ContainerdOptions
}

// Node is one kubelet and its runtime.
type Node struct {
	opts    Options
	Runtime *Runtime
	// DevicePluginDir is where device plugins put their sockets and the kubelet its
	// registration socket, at its host path.
	DevicePluginDir string
	// PodResourcesSocket is the kubelet's PodResources API, at its host path.
	PodResourcesSocket string
	// CDIDir is the CDI spec directory the runtime resolves names in.
	CDIDir string
	// RuntimeSocket is the runtime's CRI socket, at its host path.
	RuntimeSocket string

	// holder and containerd: a node on containerd (Options.Containerd).
	holder     *holder
	containerd *containerd
	// cgroup is the node's cgroupRoot on containerd, without its slash (cgroupName).
	cgroup string
	// containerIDs are the containers containerd held when the node stopped (LeftOnHost).
	containerIDs []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts the runtime and the kubelet. It returns once the kubelet process runs; the
// caller waits for the Node to be Ready as it needs.
func Start(ctx context.Context, opts Options) (*Node, error) {
	if opts.Kubelet == "" || opts.Kubeconfig == "" || opts.NodeName == "" || opts.Dir == "" {
		return nil, errors.New("kubeletnode: Kubelet, Kubeconfig, NodeName and Dir are required")
	}
	// The kubelet runs in a directory of its own: relative paths would not reach.
	for _, p := range []*string{&opts.Kubelet, &opts.Kubeconfig, &opts.Dir} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, err
		}
		*p = abs
	}
	if opts.NodeStatusUpdateFrequency == 0 {
		opts.NodeStatusUpdateFrequency = 2 * time.Second
	}
	if opts.Verbosity == 0 {
		opts.Verbosity = 1
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	n := &Node{opts: opts,
		DevicePluginDir:    filepath.Join(opts.Dir, "var-lib", "kubelet", "device-plugins"),
		PodResourcesSocket: filepath.Join(opts.Dir, "var-lib", "kubelet", "pod-resources", "kubelet.sock"),
		CDIDir:             filepath.Join(opts.Dir, "cdi"),
		RuntimeSocket:      filepath.Join(opts.Dir, "cri.sock"),
	}
	for _, d := range []string{n.DevicePluginDir, filepath.Dir(n.PodResourcesSocket), n.CDIDir, n.path("ctd"), n.path("var-log"), n.path("sysctl"), n.path("pod-logs"), n.path("volume-plugins"), n.path("cwd")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if opts.Containerd != nil {
		n.RuntimeSocket = filepath.Join(n.path("ctd"), "containerd.sock")
		n.cgroup = cgroupName(opts.NodeName)
	}
	// The configuration first: the node's namespace binds its sysctl files.
	if err := n.writeConfig(); err != nil {
		return nil, err
	}
	if opts.Containerd != nil {
		if err := n.startContainerd(ctx); err != nil {
			n.stopRuntime()
			return nil, err
		}
	} else {
		rt, err := StartRuntime(n.RuntimeSocket, n.CDIDir, opts.Runtime)
		if err != nil {
			return nil, err
		}
		n.Runtime = rt
	}
	if err := n.startKubelet(); err != nil {
		n.stopRuntime()
		return nil, err
	}
	return n, nil
}

// startContainerd starts the node's namespace holder (the binds of binds()) and containerd
// in it.
func (n *Node) startContainerd(ctx context.Context) error {
	if err := makeCgroups(n.cgroup); err != nil {
		_ = removeCgroups(n.cgroup)
		return err
	}
	h, err := startHolder(n.binds(), n.opts.Log)
	if err != nil {
		return err
	}
	n.holder = h
	c, err := startContainerd(ctx, h, n.path("ctd"), n.CDIDir, *n.opts.Containerd, n.opts.Log)
	if err != nil {
		return err
	}
	n.containerd = c
	return nil
}

// stopRuntime ends the fake runtime, or containerd, every process of the node's namespace
// and of its cgroups, and removes the cgroups.
func (n *Node) stopRuntime() {
	if n.Runtime != nil {
		n.Runtime.Stop()
	}
	if n.containerd != nil {
		ids, err := n.containerd.containers()
		if err != nil {
			fmt.Fprintf(n.opts.Log, "kubeletnode: %v\n", err)
		}
		n.containerIDs = ids
		n.containerd.stop()
	}
	if n.holder != nil {
		n.holder.stop()
		killCgroups(n.cgroup)
		if err := removeCgroups(n.cgroup); err != nil {
			fmt.Fprintf(n.opts.Log, "kubeletnode: %v\n", err)
		}
	}
}

func (n *Node) path(elem ...string) string {
	return filepath.Join(append([]string{n.opts.Dir}, elem...)...)
}

// sysctls are what the kubelet sets at start (kubelet's setupKernelTunables): files of these
// values are bound read-only over them, so it finds them set and writes nothing.
var sysctls = map[string]string{"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}

func (n *Node) writeConfig() error {
	port, err := freeport.Port()
	if err != nil {
		return err
	}
	healthz, err := freeport.Port()
	if err != nil {
		return err
	}
	// registryPullQPS 0 (no limit): the fake runtime "pulls" each pod's image at once, and
	// the default 5/s would fail a burst's pulls (ErrImagePull, retried after back-off) as
	// no node that has the image already would.
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupsPerQOS: %t
enforceNodeAllocatable: []
failCgroupV1: false
failSwapOn: false
localStorageCapacityIsolation: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
volumePluginDir: %s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Ki", nodefs.available: "0%%", imagefs.available: "0%%"}
nodeStatusUpdateFrequency: %s
serializeImagePulls: false
registryPullQPS: 0
`, cmp.Or(n.opts.NodeIP, "127.0.0.1"), port, healthz, n.opts.Containerd != nil, n.RuntimeSocket, n.path("pod-logs"), n.path("volume-plugins"), n.opts.NodeStatusUpdateFrequency)
	if n.opts.Containerd != nil {
		// The pods' cgroups (the kubelet's QoS tree), under one parent of the node's own,
		// made by startContainerd and removed by Stop: without the QoS tree the kubelet gives
		// pod sandboxes no cgroup parent, and containerd puts them at /k8s.io/<id>.
		cfg += "cgroupRoot: /" + n.cgroup + "\n"
	}
	if len(n.opts.Taints) > 0 {
		taints, err := json.Marshal(n.opts.Taints) // JSON is YAML
		if err != nil {
			return err
		}
		cfg += "registerWithTaints: " + string(taints) + "\n"
	}
	if err := os.WriteFile(n.path("kubelet.yaml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	for name, v := range sysctls {
		if err := os.WriteFile(n.path("sysctl", strings.ReplaceAll(name, "/", "-")), []byte(v+"\n"), 0o444); err != nil {
			return err
		}
	}
	return nil
}

// script is what runs in the private mount namespace before the kubelet: the binds that keep
// the host untouched. It fails (and the kubelet never starts) if any bind fails.
func (n *Node) script() string {
	var b strings.Builder
	b.WriteString(n.binds())
	b.WriteString("exec")
	for _, a := range n.kubeletArgs() {
		fmt.Fprintf(&b, " %q", a)
	}
	b.WriteString("\n")
	return b.String()
}

// binds is the shell script of the node's mounts: its own /var/lib and /var/log, a tmpfs
// /run (on containerd, with the node's CDI directory at /run/cdi), the sysctl files.
func (n *Node) binds() string {
	var b strings.Builder
	b.WriteString("set -e\n")
	fmt.Fprintf(&b, "mount --bind %q /var/lib\n", n.path("var-lib"))
	fmt.Fprintf(&b, "mount --bind %q /var/log\n", n.path("var-log"))
	b.WriteString("mount -t tmpfs tmpfs /run\n")
	if n.opts.Containerd != nil {
		// The runtimes' CDI directory is the node's: what a device plugin pod writes at
		// /var/run/cdi (a hostPath) is what containerd reads. containerd's socket is at its
		// usual /run/containerd/containerd.sock, where a device plugin pod looks for it.
		fmt.Fprintf(&b, "mkdir -p /run/cdi\nmount --bind %q /run/cdi\n", n.CDIDir)
		fmt.Fprintf(&b, "mkdir -p /run/containerd\nmount --bind %q /run/containerd\n", n.path("ctd"))
	}
	for name := range sysctls {
		f := n.path("sysctl", strings.ReplaceAll(name, "/", "-"))
		fmt.Fprintf(&b, "mount --bind %q /proc/sys/%s\nmount -o remount,bind,ro /proc/sys/%s\n", f, name, name)
	}
	if n.opts.Containerd != nil {
		// Shared within the node's namespace (its mounts are copies, private to the host),
		// as on a host: containerd mounts a hostPath with HostToContainer propagation only
		// from a shared or slave mount (the device plugin's /host/run).
		b.WriteString("mount --make-rshared /\n")
	}
	return b.String()
}

func (n *Node) kubeletArgs() []string {
	args := []string{n.opts.Kubelet, "--config=" + n.path("kubelet.yaml"), "--kubeconfig=" + n.opts.Kubeconfig,
		"--root-dir=/var/lib/kubelet", "--cert-dir=" + n.path("pki"), "--hostname-override=" + n.opts.NodeName,
		"-v=" + strconv.Itoa(n.opts.Verbosity)}
	if n.opts.NodeIP != "" {
		args = append(args, "--node-ip="+n.opts.NodeIP)
	}
	if os.Geteuid() != 0 {
		args = append(args, "--feature-gates=KubeletInUserNamespace=true")
	}
	return args
}

func (n *Node) startKubelet() error {
	unshare := []string{"-m", "--propagation", "private"}
	if os.Geteuid() != 0 {
		unshare = []string{"-Urm", "--propagation", "private"}
	}
	cmd := exec.Command("unshare", append(unshare, "sh", "-c", n.script())...)
	if n.holder != nil {
		args := n.kubeletArgs()
		cmd = n.holder.command(args[0], args[1:]...)
	}
	cmd.Stdout, cmd.Stderr = n.opts.Log, n.opts.Log
	// An empty working directory of its own: whatever a relative path in the kubelet
	// touches stays in the node's directory.
	cmd.Dir = n.path("cwd")
	// Its own process group, so Stop ends the kubelet and nothing else.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the kubelet: %w", err)
	}
	done := make(chan struct{})
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()
	go func() {
		err := cmd.Wait()
		n.mu.Lock()
		n.err = err
		n.mu.Unlock()
		close(done)
	}()
	return nil
}

// StopKubelet ends the kubelet (SIGTERM, then SIGKILL after 10 s) and waits for it; the
// runtime and its containers stay, as a kubelet restart leaves them.
func (n *Node) StopKubelet() {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// RestartKubelet stops the kubelet and starts it again on the same directories.
func (n *Node) RestartKubelet() error {
	n.StopKubelet()
	return n.startKubelet()
}

// Exited reports whether the kubelet has exited, and with what.
func (n *Node) Exited() (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-n.done:
		return true, n.err
	default:
		return false, nil
	}
}

// Stop ends the kubelet and the runtime.
func (n *Node) Stop() {
	n.StopKubelet()
	n.stopRuntime()
}

// Ready reports whether the Node is Ready by a heartbeat after since (the zero time: any),
// and says what its Ready condition holds.
func Ready(node *v1.Node, since time.Time) (bool, string) {
	for _, c := range node.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue && c.LastHeartbeatTime.After(since), c.Reason + ": " + c.Message
		}
	}
	return false, "no Ready condition"
}

// LogBuffer collects output (the kubelet's, a component's) for a failure message; safe for
// concurrent writers.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

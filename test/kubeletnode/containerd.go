package kubeletnode

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dynamig/dynamig/test/kubeletnode/runtimetools"
	"github.com/dynamig/dynamig/test/netns"
)

// ContainerdOptions make a node run on real containerd and runc instead of the fake runtime.
type ContainerdOptions struct {
	// Tools is runtimetools.Dir's directory.
	Tools string
	// Images are OCI image archives (package images' WriteArchive) imported before the
	// kubelet starts: nothing can be pulled.
	Images []string
	// SandboxImage is the pause image (one of Images' names).
	SandboxImage string
	// PodSubnet, when set (an IPv4 CIDR, one per node), gives pods a network: CNI's ptp
	// plugin makes each pod a veth pair with a route to it, and host-local gives it an
	// address of PodSubnet. Pods then reach, and are reached from, the test's network
	// namespace, which must be one of the test's own (test/netns): the veths and routes
	// are made there. Unset, pods get an address and no network (cnistub).
	PodSubnet string
	// CDIOff runs the node on containerd 1.7 with enable_cdi = false, its default there:
	// containers start without the edits of the CDI devices they are given, and the runtime
	// says so in its CRI status (containerd 2.x cannot turn CDI off).
	CDIOff bool
}

// CheckContainerd says whether this machine can run a node on containerd: as root (runc
// makes namespaces and cgroups), with nsenter.
func CheckContainerd() error {
	if os.Geteuid() != 0 {
		return errors.New("a node on containerd and runc runs as root (runc makes the containers' namespaces and cgroups)")
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		return errors.New("a node on containerd starts containerd and the kubelet in the node's mount namespace with nsenter (util-linux), which is not installed")
	}
	return CheckIsolation()
}

// holder is the process that keeps a node's private mount namespace, in which containerd,
// its shims and the kubelet run (started with nsenter): a containerd started later in a new
// namespace would leave earlier pods' shims in the old one.
type holder struct {
	cmd *exec.Cmd
}

func startHolder(binds string, log io.Writer) (*holder, error) {
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", binds+"echo ready\nexec sleep infinity\n")
	cmd.Stderr = log
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the node's namespace: %w", err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("the node's namespace: its mounts failed (%v)", err)
	}
	return &holder{cmd: cmd}, nil
}

func (h *holder) pid() int { return h.cmd.Process.Pid }

// command is name with args run in the holder's mount namespace.
func (h *holder) command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"-t", strconv.Itoa(h.pid()), "-m", "--", name}, args...)...)
}

// stop kills every process in the namespace (containerd, shims, containers' processes the
// shims left), then the holder.
func (h *holder) stop() {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", h.pid()))
	own, _ := os.Readlink("/proc/self/ns/mnt")
	// Never the host's namespace (were the holder gone and its pid reused).
	if err == nil && ns != own {
		for range 3 {
			if killNamespace(ns, h.pid()) == 0 {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	_ = h.cmd.Process.Kill()
	_ = h.cmd.Wait()
}

// killNamespace kills every process but except whose mount namespace is ns, and says how many.
func killNamespace(ns string, except int) int {
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == except {
			continue
		}
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && link == ns {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			n++
		}
	}
	return n
}

// containerd is a node's containerd, in its holder's namespace.
type containerd struct {
	cmd    *exec.Cmd
	socket string
	ctr    string // runtimetools.Dir's ctr
	done   chan struct{}
}

// containers lists the IDs of the containers and pod sandboxes containerd holds for the CRI.
func (c *containerd) containers() ([]string, error) {
	out, err := exec.Command(c.ctr, "--address", c.socket, "--namespace", "k8s.io", "containers", "list", "--quiet").Output()
	if err != nil {
		return nil, fmt.Errorf("listing containerd's containers: %w", err)
	}
	return strings.Fields(string(out)), nil
}

// containerdConfig is containerd 2.x's configuration for a node: everything under dir, the
// node's CDI spec directory, runc as the runtime (through noseccomp), cnistub behind loopback as the network,
// the pause image pinned, and the one setting without which every sandbox fails on a machine
// whose root lacks CAP_SYS_RESOURCE (restrict_oom_score_adj).
func containerdConfig(dir, tools, cdiDir, sandboxImage string) string {
	return fmt.Sprintf(`version = 4
root = %[1]q
state = %[2]q

[plugins.'io.containerd.server.v1.grpc']
  address = %[3]q
[plugins.'io.containerd.server.v1.ttrpc']
  address = %[4]q
[plugins.'io.containerd.server.v1.debug']
  address = ''
[plugins.'io.containerd.server.v1.metrics']
  address = ''
[plugins.'io.containerd.shim.v1.manager']
  socket_dir = %[10]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'native'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[5]q

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = [%[6]q]
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
%[7]s  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[8]q]
    conf_dir = %[9]q

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'

[plugins.'io.containerd.nri.v1.nri']
  disable = true
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "containerd.sock"), filepath.Join(dir, "containerd.ttrpc.sock"),
		sandboxImage, cdiDir, runcRuntime("plugins.'io.containerd.cri.v1.runtime'.containerd", dir, tools), tools, filepath.Join(dir, "cni"), filepath.Join(dir, "s"))
}

// runcRuntime is the CRI plugin's runc runtime, under table (its containerd section, whose key
// differs between 1.x and 2.x): runc through noseccomp, its state under dir, cgroupfs.
func runcRuntime(table, dir, tools string) string {
	return fmt.Sprintf(`    [%[1]s.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [%[1]s.runtimes.runc.options]
        BinaryName = %[2]q
        Root = %[3]q
        SystemdCgroup = false
`, table, filepath.Join(tools, "noseccomp"), filepath.Join(dir, "runc"))
}

// containerd17Config is containerd 1.7's configuration (version 2) of the same node as
// containerdConfig's, with CDI off.
func containerd17Config(dir, tools, sandboxImage string) string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  address = ''
[metrics]
  address = ''

[plugins.'io.containerd.grpc.v1.cri']
  enable_cdi = false
  sandbox_image = %[5]q
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
  [plugins.'io.containerd.grpc.v1.cri'.containerd]
    snapshotter = 'native'
    default_runtime_name = 'runc'
%[6]s  [plugins.'io.containerd.grpc.v1.cri'.cni]
    bin_dir = %[7]q
    conf_dir = %[8]q

[plugins.'io.containerd.nri.v1.nri']
  disable = true
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "containerd.sock"), filepath.Join(dir, "containerd.ttrpc.sock"),
		sandboxImage, runcRuntime("plugins.'io.containerd.grpc.v1.cri'.containerd", dir, tools), tools, filepath.Join(dir, "cni"))
}

// cniConfig is the node's pod network: the loopback plugin (each pod's lo), then cnistub (an
// address, no network) or, with a subnet, ptp and host-local (a veth pair and a route per
// pod, addresses of the subnet, the IPAM state under dir).
func cniConfig(subnet, dir string) string {
	if subnet == "" {
		return `{
  "cniVersion": "1.0.0",
  "name": "dynamig-test",
  "plugins": [{"type": "loopback"}, {"type": "cnistub"}]
}
`
	}
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "dynamig-test",
  "plugins": [
    {"type": "loopback"},
    {"type": "ptp", "ipMasq": false, "ipam": {"type": "host-local", "dataDir": %q,
      "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}}
  ]
}
`, dir, subnet)
}

// startContainerd writes the node's containerd configuration under dir, starts containerd in
// h's namespace, waits for its socket and imports the images.
func startContainerd(ctx context.Context, h *holder, dir, cdiDir string, opts ContainerdOptions, log io.Writer) (*containerd, error) {
	for _, d := range []string{dir, filepath.Join(dir, "cni")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if opts.PodSubnet != "" {
		if _, _, err := net.ParseCIDR(opts.PodSubnet); err != nil {
			return nil, fmt.Errorf("kubeletnode: PodSubnet: %w", err)
		}
		// ptp makes veths and routes in containerd's network namespace: never the host's.
		if !netns.Private() {
			return nil, errors.New("kubeletnode: a pod network (PodSubnet) is made only in the test's own network namespace (test/netns: netns.Main in TestMain)")
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cni", "10-dynamig-test.conflist"), []byte(cniConfig(opts.PodSubnet, filepath.Join(dir, "ipam"))), 0o644); err != nil {
		return nil, err
	}
	cfg, bin := containerdConfig(dir, opts.Tools, cdiDir, opts.SandboxImage), opts.Tools
	if opts.CDIOff {
		cfg, bin = containerd17Config(dir, opts.Tools, opts.SandboxImage), filepath.Join(opts.Tools, runtimetools.Containerd17Dir)
	}
	cfgFile := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	c := &containerd{socket: filepath.Join(dir, "containerd.sock"), ctr: filepath.Join(opts.Tools, "ctr"), done: make(chan struct{})}
	c.cmd = h.command(filepath.Join(bin, "containerd"), "--config", cfgFile)
	// The shim is found on PATH.
	c.cmd.Env = append(os.Environ(), "PATH="+bin+":"+opts.Tools+":"+os.Getenv("PATH"))
	c.cmd.Stdout, c.cmd.Stderr = log, log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting containerd: %w", err)
	}
	go func() { _ = c.cmd.Wait(); close(c.done) }()
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := net.Dial("unix", c.socket)
		if err == nil {
			conn.Close()
			break
		}
		select {
		case <-c.done:
			return nil, errors.New("containerd exited at start")
		case <-ctx.Done():
			c.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.stop()
			return nil, fmt.Errorf("containerd's socket %s: %w", c.socket, err)
		}
	}
	importArgs := []string{"--address", c.socket, "--namespace", "k8s.io", "images", "import"}
	if opts.CDIOff {
		// 1.7's transfer service, which ctr 2.x imports through, stores an image without
		// unpacking it or marking it the CRI's: the CRI would then try to pull it.
		importArgs = append(importArgs, "--local", "--snapshotter", "native")
	}
	for _, archive := range opts.Images {
		cmd := exec.CommandContext(ctx, c.ctr, append(importArgs, archive)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			c.stop()
			return nil, fmt.Errorf("importing %s into containerd: %w: %s", archive, err, out)
		}
	}
	return c, nil
}

// stop ends containerd (SIGTERM, then SIGKILL after 10 s); its shims and containers stay.
func (c *containerd) stop() {
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
	}
}

// cgroupDirs are the node's cgroup directories on the host (cgroupRoot /<name>), one per
// controller hierarchy on cgroup v1, one on v2.
func cgroupDirs(name string) []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{filepath.Join("/sys/fs/cgroup", name)}
	}
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name(), name))
		}
	}
	return out
}

// makeCgroups makes the node's cgroup directories (the kubelet's cgroupRoot, which it
// requires to exist); on cgroup v1 the cpuset one gets its parent's CPUs and memory nodes,
// without which no process may join it or its children.
func makeCgroups(name string) error {
	for _, d := range cgroupDirs(name) {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("making cgroup %s: %w", d, err)
		}
		// cgroup v2: the kubelet's pod cgroups below get every controller this one has.
		if raw, err := os.ReadFile(filepath.Join(d, "cgroup.controllers")); err == nil {
			var enable []string
			for _, c := range strings.Fields(string(raw)) {
				enable = append(enable, "+"+c)
			}
			if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0o644); err != nil {
				return fmt.Errorf("cgroup %s: enabling %v: %w", d, enable, err)
			}
			continue
		}
		if filepath.Base(filepath.Dir(d)) != "cpuset" {
			continue
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(filepath.Dir(d), f))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
				return fmt.Errorf("cgroup %s: %w", d, err)
			}
		}
	}
	return nil
}

// killCgroups kills every process in the node's cgroups: the containers' processes, which
// outlive their shims.
func killCgroups(name string) {
	for range 10 {
		n := 0
		for _, root := range cgroupDirs(name) {
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				raw, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
				for _, f := range strings.Fields(string(raw)) {
					if pid, err := strconv.Atoi(f); err == nil {
						_ = syscall.Kill(pid, syscall.SIGKILL)
						n++
					}
				}
				return nil
			})
		}
		if n == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeCgroups removes the node's cgroup directories, deepest first (a cgroup directory
// is removed with rmdir once it holds no process and no child).
func removeCgroups(name string) error {
	var errs []error
	for _, root := range cgroupDirs(name) {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// LeftOnHost lists what of the node is still on the host after Stop: its cgroup directories,
// and for each container containerd held when it stopped, a cgroup of its own elsewhere
// (containerd's default parent, /k8s.io/<id>, where it puts a container the kubelet gave no
// parent) or a process in one.
func (n *Node) LeftOnHost() []string {
	if n.cgroup == "" {
		return nil // the fake runtime: no process, no cgroup
	}
	// The node's own cgroups, then containerd's default place for each container.
	names := []string{n.cgroup}
	for _, id := range n.containerIDs {
		names = append(names, path.Join("k8s.io", id))
	}
	var out []string
	for _, name := range names {
		for _, d := range cgroupDirs(name) {
			if _, err := os.Stat(d); err == nil {
				out = append(out, d)
			}
		}
	}
	if len(n.containerIDs) == 0 {
		return out
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !alive(e.Name()) {
			continue
		}
		for _, id := range n.containerIDs {
			if strings.Contains(string(raw), id) {
				out = append(out, fmt.Sprintf("process %s (of container %s)", e.Name(), id))
				break
			}
		}
	}
	return out
}

// alive says whether process pid runs: not a zombie that its new parent (containers'
// processes are reparented when their shim is killed) has yet to reap.
func alive(pid string) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return false
	}
	// pid (comm) state …: comm may hold spaces and parentheses.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

// cgroupNames numbers the nodes a process starts (cgroupName).
var cgroupNames atomic.Int64

// cgroupName is a node's cgroupRoot, without its slash: named after the node, the process and
// the node's number in it, since test processes run at once (make test's two lanes run
// test/kubeletnode on two kubelets) start nodes of the same name, and each node's Stop kills
// every process in its cgroups.
func cgroupName(nodeName string) string {
	return fmt.Sprintf("dynamig-test-%s-%d-%d", nodeName, os.Getpid(), cgroupNames.Add(1))
}

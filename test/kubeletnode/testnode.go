package kubeletnode

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynamig/dynamig/images"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/kubeletnode/runtimetools"
	"github.com/dynamig/dynamig/test/probe/report"
)

// StartTestNode starts a control plane and one kubelet named name for a test, both stopped
// when it ends (the kubelet's output is logged if it failed). It returns the node and an
// admin client; the caller waits for what it needs (the Node Ready, devices advertised).
func StartTestNode(t *testing.T, name string) (*Node, kubernetes.Interface) {
	t.Helper()
	return startTestNode(t, name, nil)
}

// startTestNode is StartTestNode, on containerd when ctd is set (StartForTest).
func startTestNode(t *testing.T, name string, ctd *ContainerdOptions) (*Node, kubernetes.Interface) {
	t.Helper()
	kubelet, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	cp, err := cluster.Start(t, cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := cp.Client(cluster.UserAdmin)
	if err != nil {
		t.Fatal(err)
	}
	n := StartForTest(t, context.Background(), Options{Kubelet: kubelet, Kubeconfig: cp.Kubeconfig, NodeName: name, Containerd: ctd})
	return n, client
}

// StartForTest starts a node of opts for t in a directory of its own (opts.Dir, made here
// when empty), its output kept in a buffer (opts.Log) and logged if t fails; when t ends the
// node is stopped, the test fails if anything of it is left on the host (its cgroups) or the
// host's sysctls the kubelet would set changed, and the directory is removed.
func StartForTest(t *testing.T, ctx context.Context, opts Options) *Node {
	t.Helper()
	before := hostSysctls()
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", opts.NodeName) // short: unix socket paths are limited
		if err != nil {
			t.Fatal(err)
		}
		opts.Dir = dir
	}
	log := &LogBuffer{}
	opts.Log = log
	n, err := Start(ctx, opts)
	if err != nil {
		_ = os.RemoveAll(opts.Dir)
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		n.Stop()
		if t.Failed() {
			out := log.String()
			t.Logf("node %s's output (last 30000 bytes):\n%s", opts.NodeName, out[max(0, len(out)-30000):])
		}
		if left := n.LeftOnHost(); len(left) > 0 {
			t.Errorf("node %s left on the host: %v", opts.NodeName, left)
		}
		if after := hostSysctls(); after != before {
			t.Errorf("host sysctls changed: %q → %q", before, after)
		}
		_ = os.RemoveAll(opts.Dir)
	})
	return n
}

// The images a node on containerd is given (StartContainerdTestNode): the probe
// (test/probe), and the probe as the pause image.
const (
	ProbeImage = "dynamig.test/probe:1"
	PauseImage = "dynamig.test/pause:1"
)

// StartContainerdTestNode is StartTestNode on real containerd and runc (runtimetools.Dir), with
// the probe's images imported, its other options those of opts; it skips the test where this
// machine cannot run such a node (CheckContainerd).
func StartContainerdTestNode(t *testing.T, name string, opts ContainerdOptions) (*Node, kubernetes.Interface) {
	t.Helper()
	if err := CheckContainerd(); err != nil {
		t.Skip(err)
	}
	tools, err := runtimetools.Dir()
	if err != nil {
		t.Fatal(err)
	}
	archives, err := ProbeArchives(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opts.Tools, opts.Images, opts.SandboxImage = tools, archives, PauseImage
	return startTestNode(t, name, &opts)
}

// ProbeArchives builds the probe (static) and writes its two images (ProbeImage,
// PauseImage) into dir as OCI archives.
func ProbeArchives(dir string) ([]string, error) {
	bin := filepath.Join(dir, "probe")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/dynamig/dynamig/test/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the probe: %w\n%s", err, out)
	}
	var out []string
	for _, im := range []struct {
		ref  string
		args []string
	}{{ProbeImage, nil}, {PauseImage, []string{"pause"}}} {
		img, err := images.Build(images.Spec{Name: "probe", Binary: bin, Args: im.args})
		if err != nil {
			return nil, err
		}
		file := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(im.ref)+".tar")
		if err := images.WriteArchive(file, im.ref, img); err != nil {
			return nil, err
		}
		out = append(out, file)
	}
	return out, nil
}

// ProbeReport is the report the probe printed in container of p on node n (its first line
// on stdout, from the CRI log file in the node's pod log directory: lines of
// "<time> <stream> <tag> <text>"); an error while there is none yet.
func (n *Node) ProbeReport(p *v1.Pod, container string) (report.Report, error) {
	var r report.Report
	file := n.path("pod-logs", p.Namespace+"_"+p.Name+"_"+string(p.UID), container, "0.log")
	f, err := os.Open(file)
	if err != nil {
		return r, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		if fields := strings.SplitN(s.Text(), " ", 4); len(fields) == 4 && fields[1] == "stdout" {
			return r, json.Unmarshal([]byte(fields[3]), &r)
		}
	}
	return r, fmt.Errorf("%s: no line on stdout yet", file)
}

// ContainerLog is the CRI log of the latest run of container in pod p on node n (lines of
// "<time> <stream> <tag> <text>"), its last max bytes.
func (n *Node) ContainerLog(p *v1.Pod, container string, max int) (string, error) {
	files, err := filepath.Glob(n.path("pod-logs", p.Namespace+"_"+p.Name+"_"+string(p.UID), container, "*.log"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no log of %s/%s container %s on %s", p.Namespace, p.Name, container, n.opts.NodeName)
	}
	slices.SortFunc(files, func(a, b string) int { return logRun(a) - logRun(b) })
	raw, err := os.ReadFile(files[len(files)-1])
	if err != nil {
		return "", err
	}
	return string(raw[len(raw)-min(len(raw), max):]), nil
}

// logRun is the restart count a CRI log file is named after (<count>.log).
func logRun(file string) int {
	n, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(file), ".log"))
	return n
}

// hostSysctls reads the sysctls the kubelet would set.
func hostSysctls() string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(sysctls)) {
		b, err := os.ReadFile("/proc/sys/" + name)
		if err != nil {
			return err.Error()
		}
		out = append(out, name+"="+strings.TrimSpace(string(b)))
	}
	return strings.Join(out, " ")
}

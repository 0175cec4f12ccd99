// Package realcluster is a cluster on one machine made of the parts users run: etcd,
// kube-apiserver, kube-controller-manager and the default kube-scheduler (in-process, from
// the pinned Kubernetes modules), nodes whose real kubelet runs pods on real containerd and
// runc with a pod network (test/kubeletnode, test/netns), and dynamig installed into it by
// its Helm chart with Helm's SDK, its scheduler, webhook and device plugins running as pods
// of their Deployments and DaemonSet, from images built here (package images). The only
// stand-in is NVML: the device plugin's own simulator (--nvml=sim through the chart's
// devicePlugin.extraArgs).
//
// The suite's TestMain calls Main: the tests run in a network namespace of their own, where
// the pods' veths and routes are made and the kubernetes Service's cluster IP is served.
package realcluster

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	containerregistry "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/images"
	"github.com/dynamig/dynamig/manifests"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/cluster/controllermanager"
	"github.com/dynamig/dynamig/test/kubeletnode"
	"github.com/dynamig/dynamig/test/kubeletnode/runtimetools"
	"github.com/dynamig/dynamig/test/netns"
	"github.com/dynamig/dynamig/version"
)

// The install: dynamig's release and namespace, and the registry its images are named in
// (global.imageRegistry; nothing is pulled: each node has them imported).
const (
	Release   = "dynamig"
	Namespace = "dynamig-system"
	Registry  = "dynamig.test"
	imageTag  = "test"
)

// CDIOffTaint is the taint of Options.CDIOffNodes: GPU nodes are commonly tainted
// nvidia.com/gpu, which the chart's device plugin tolerates.
var CDIOffTaint = v1.Taint{Key: "nvidia.com/gpu", Value: "cdi-off", Effect: v1.TaintEffectNoSchedule}

// CUDAImage is an image of NVIDIA's that workloads run, which sets NVIDIA_VISIBLE_DEVICES=all
// (every GPU of the node, where the NVIDIA runtime reads it): each node has it as the probe
// with CUDA's base image environment.
const CUDAImage = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"

// UbuntuImages are the images the examples run, which each node has as the probe.
var UbuntuImages = []string{"docker.io/library/ubuntu:20.04", "docker.io/library/ubuntu:22.04"}

// Main is the suite's TestMain: it builds what the clusters need while the host's network
// is reachable (the real runtime, the kubelet, the images), then the tests run in a network
// namespace of their own (netns.Main), with quiet component logs unless -v.
func Main(m *testing.M) {
	flag.Parse()
	netns.Main(m, prepare)
	cluster.QuietLogs(testing.Verbose())
	os.Exit(m.Run())
}

// imagesEnv names the directory of the image archives prepare built.
const imagesEnv = "DYNAMIG_REALCLUSTER_IMAGES"

// prepare builds the real runtime and the kubelet (or takes them from the environment) and
// the image archives, and hands them to the tests through the environment.
func prepare() (func(), error) {
	if err := kubeletnode.CheckContainerd(); err != nil {
		return func() {}, nil // the tests skip, saying why
	}
	tools, err := runtimetools.Dir()
	if err != nil {
		return nil, err
	}
	kubelet, err := kubeletnode.Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "realcluster-images-")
	if err != nil {
		return nil, err
	}
	if _, err := buildImages(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for k, v := range map[string]string{runtimetools.Env: tools, kubeletnode.KubeletEnv: kubelet, imagesEnv: dir} {
		os.Setenv(k, v)
	}
	return func() { os.RemoveAll(dir) }, nil
}

// Options shape a cluster.
type Options struct {
	// Nodes are the GPU nodes' names (labelled gpu=on, so the device plugin runs there).
	Nodes []string
	// CDIOffNodes are more GPU nodes, on containerd 1.7 with CDI off (its default there),
	// tainted CDIOffTaint: only pods that tolerate it run there (the device plugin does).
	CDIOffNodes []string
	// SimGPUs are every GPU node's simulated GPUs (--sim-gpus), default A100-40GB:1.
	SimGPUs string
}

// Cluster is a running cluster with dynamig installed.
type Cluster struct {
	CP     *cluster.ControlPlane
	Client kubernetes.Interface
	// Nodes by name.
	Nodes map[string]*kubeletnode.Node
}

// Start starts a cluster for t and installs dynamig; everything is stopped, and checked to
// have left nothing on the host, when t ends. It skips t where this machine cannot run one
// (not root, no namespaces, no nsenter).
func Start(t *testing.T, opts Options) *Cluster {
	t.Helper()
	netns.Require(t)
	if err := kubeletnode.CheckContainerd(); err != nil {
		t.Skip(err)
	}
	if opts.SimGPUs == "" {
		opts.SimGPUs = "A100-40GB:1"
	}
	kubelet, err := kubeletnode.Binary()
	if err != nil {
		t.Fatal(err)
	}
	tools, err := runtimetools.Dir()
	if err != nil {
		t.Fatal(err)
	}
	archives, err := imageArchives()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	cp, err := cluster.Start(t, cluster.Options{
		Empty:       true,
		Users:       map[string][]string{"system:kube-scheduler": nil},
		Controllers: controllermanager.Start,
		// The API server calls the webhook at its pod's address (the Service's endpoints):
		// no kube-proxy makes the Service's cluster IP reach it.
		APIServerFlags: []string{"--enable-aggregator-routing=true"},
	})
	if err != nil {
		t.Fatal(err)
	}
	client, err := cp.Client(cluster.UserAdmin)
	if err != nil {
		t.Fatal(err)
	}
	if err := serveKubernetesService(ctx, client, cp); err != nil {
		t.Fatal(err)
	}
	stopScheduler, err := startDefaultScheduler(ctx, cp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopScheduler)

	c := &Cluster{CP: cp, Client: client, Nodes: map[string]*kubeletnode.Node{}}
	for i, name := range slices.Concat(opts.Nodes, opts.CDIOffNodes) {
		c.startNode(t, ctx, i, name, kubelet, tools, archives, i >= len(opts.Nodes))
	}
	values := map[string]any{
		"global": map[string]any{"imageRegistry": Registry},
		"images": map[string]any{
			"scheduler":    map[string]any{"tag": imageTag, "pullPolicy": "Never"},
			"webhook":      map[string]any{"tag": imageTag, "pullPolicy": "Never"},
			"devicePlugin": map[string]any{"tag": imageTag, "pullPolicy": "Never"},
		},
		"scheduler": map[string]any{
			"replicas":         1,
			"admissionWebhook": map[string]any{"replicas": 1},
		},
		// The simulated GPUs keep their instances in a file on the node, as real GPUs do,
		// across the plugin pod's restarts.
		"devicePlugin": map[string]any{"extraArgs": []any{"--nvml=sim", "--sim-gpus=" + opts.SimGPUs,
			"--sim-state=/var/lib/kubelet/device-plugins/dynamig-sim-gpus.json"}},
	}
	if err := install(ctx, cp, values); err != nil {
		t.Fatal(err)
	}
	if err := c.waitReady(ctx, 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, c.Describe(ctx))
	}
	return c
}

// startNode starts a GPU node on containerd with address 10.89.0.<i+1> and pod subnet
// 10.88.<i+1>.0/24, its images imported, and labels it gpu=on once registered; cdiOff puts it
// on containerd 1.7 with CDI off, tainted CDIOffTaint.
func (c *Cluster) startNode(t *testing.T, ctx context.Context, i int, name, kubelet, tools string, archives []string, cdiOff bool) {
	t.Helper()
	ip := net.IPv4(10, 89, 0, byte(i+1))
	if err := netns.AddLocalAddress(ip); err != nil {
		t.Fatal(err)
	}
	opts := kubeletnode.Options{Kubelet: kubelet, Kubeconfig: c.CP.Kubeconfig, NodeName: name, NodeIP: ip.String(),
		Containerd: &kubeletnode.ContainerdOptions{Tools: tools, Images: archives, SandboxImage: kubeletnode.PauseImage,
			PodSubnet: fmt.Sprintf("10.88.%d.0/24", i+1), CDIOff: cdiOff}}
	if cdiOff {
		opts.Taints = []v1.Taint{CDIOffTaint}
	}
	n := kubeletnode.StartForTest(t, ctx, opts)
	c.Nodes[name] = n
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"labels":{"gpu":"on"}}}`), metav1.PatchOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("node %s did not register: %v", name, err)
	}
}

// serveKubernetesService makes the kubernetes Service's cluster IP reach the API server in
// the test's network namespace, as kube-proxy does on a node: pods' in-cluster clients dial
// KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT (the API server's certificate names the
// address).
func serveKubernetesService(ctx context.Context, client kubernetes.Interface, cp *cluster.ControlPlane) error {
	svc, err := client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return err
	}
	ip := net.ParseIP(svc.Spec.ClusterIP)
	if ip == nil || len(svc.Spec.Ports) == 0 {
		return fmt.Errorf("the kubernetes Service has no cluster IP or port: %+v", svc.Spec)
	}
	if err := netns.AddLocalAddress(ip); err != nil {
		return err
	}
	server, err := url.Parse(cp.Config.Host)
	if err != nil {
		return err
	}
	return netns.Proxy(ctx, net.JoinHostPort(ip.String(), fmt.Sprint(svc.Spec.Ports[0].Port)), server.Host)
}

// startDefaultScheduler runs kube-scheduler's default profile in-process, as
// system:kube-scheduler: the cluster's own scheduler, which places dynamig's pods.
func startDefaultScheduler(ctx context.Context, cp *cluster.ControlPlane) (func(), error) {
	kubeconfig, err := cp.WriteKubeconfig("system:kube-scheduler")
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(cp.Dir, "default-scheduler.yaml")
	doc := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
leaderElection:
  leaderElect: false
profiles:
- schedulerName: default-scheduler
`, kubeconfig)
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		return nil, err
	}
	return cluster.StartScheduler(ctx, cp, cfg)
}

// install installs the embedded chart as Helm's install does (action.Install, release
// storage in Secrets), into Namespace, created by Helm.
func install(ctx context.Context, cp *cluster.ControlPlane, values map[string]any) error {
	chart, err := manifests.Chart()
	if err != nil {
		return err
	}
	flags := genericclioptions.NewConfigFlags(false)
	kubeconfig, ns := cp.Kubeconfig, Namespace
	flags.KubeConfig, flags.Namespace = &kubeconfig, &ns
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, Namespace, "secret", func(string, ...any) {}); err != nil {
		return fmt.Errorf("helm: %w", err)
	}
	inst := action.NewInstall(cfg)
	inst.ReleaseName, inst.Namespace, inst.CreateNamespace = Release, Namespace, true
	inst.Timeout = 2 * time.Minute
	// Helm's capabilities as it reads them from the cluster (action.Configuration's), but
	// the version: the in-process API server reports v0.0.0-master, and the chart checks the
	// version and names the scheduler image's minor after it.
	kv, err := kubernetesRelease()
	if err != nil {
		return err
	}
	dc, err := flags.ToDiscoveryClient()
	if err != nil {
		return err
	}
	apiVersions, err := action.GetVersionSet(dc)
	if err != nil {
		return err
	}
	cfg.Capabilities = &chartutil.Capabilities{KubeVersion: *kv, APIVersions: apiVersions, HelmVersion: chartutil.DefaultCapabilities.HelmVersion}
	if _, err := inst.RunWithContext(ctx, chart, values); err != nil {
		return fmt.Errorf("helm install: %w", err)
	}
	return nil
}

// waitReady waits until the scheduler's and webhook's Deployments are available, the device
// plugin runs Ready on every GPU node, and each node advertises its GPUs.
func (c *Cluster) waitReady(ctx context.Context, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		for _, name := range []string{"dynamig-scheduler", "dynamig-webhook"} {
			d, err := c.Client.AppsV1().Deployments(Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false, nil
			}
			if !available(d) {
				last = fmt.Sprintf("Deployment %s: %d of %d available", name, d.Status.AvailableReplicas, ptr.Deref(d.Spec.Replicas, 1))
				return false, nil
			}
		}
		ds, err := c.Client.AppsV1().DaemonSets(Namespace).Get(ctx, "dynamig-device-plugin", metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		if int(ds.Status.NumberReady) != len(c.Nodes) {
			last = fmt.Sprintf("DaemonSet dynamig-device-plugin: %d of %d ready", ds.Status.NumberReady, len(c.Nodes))
			return false, nil
		}
		for name := range c.Nodes {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false, nil
			}
			if q := n.Status.Allocatable[v1.ResourceName("nvidia.com/gpu")]; q.IsZero() {
				last = fmt.Sprintf("node %s advertises no nvidia.com/gpu", name)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("dynamig did not come up: %s", last)
	}
	return nil
}

func available(d *appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable && c.Status == v1.ConditionTrue {
			return d.Status.AvailableReplicas >= ptr.Deref(d.Spec.Replicas, 1)
		}
	}
	return false
}

// Describe is what a failed start or test shows: every pod of the cluster with its phase,
// conditions and containers' states, and the events of dynamig's namespace.
func (c *Cluster) Describe(ctx context.Context) string {
	var b strings.Builder
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s/%s on %q: %s", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, cond := range p.Status.Conditions {
			if cond.Status != v1.ConditionTrue {
				fmt.Fprintf(&b, " %s=%s(%s)", cond.Type, cond.Status, cond.Message)
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, " [%s ready=%v restarts=%d %+v]", cs.Name, cs.Ready, cs.RestartCount, cs.State)
		}
		b.WriteString("\n")
		n := c.Nodes[p.Spec.NodeName]
		for _, cs := range p.Status.ContainerStatuses {
			if n == nil || cs.Ready {
				continue
			}
			if log, err := n.ContainerLog(&p, cs.Name, 3000); err == nil {
				fmt.Fprintf(&b, "  its container %s's log (last 3000 bytes):\n%s\n", cs.Name, log)
			}
		}
	}
	events, err := c.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, e := range events.Items {
			if e.Type == v1.EventTypeWarning || e.InvolvedObject.Namespace == Namespace {
				fmt.Fprintf(&b, "event %s %s/%s %s: %s\n", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	}
	return b.String()
}

// imageArchives are the OCI archives prepare built: dynamig's three images, the probe's,
// the pause image and ubuntu's and CUDA's stand-ins.
func imageArchives() ([]string, error) {
	dir := os.Getenv(imagesEnv)
	if dir == "" {
		return nil, fmt.Errorf("%s is not set: the suite's TestMain is realcluster.Main", imagesEnv)
	}
	archives, err := filepath.Glob(filepath.Join(dir, "*.tar"))
	if err == nil && len(archives) == 0 {
		err = fmt.Errorf("no image archives in %s", dir)
	}
	return archives, err
}

// buildImages builds dynamig's three binaries as `make build` does (the scheduler on this
// test binary's Kubernetes minor) and writes into dir their images as package images makes
// them, tagged as the chart names them with Registry and imageTag (the scheduler's with the
// minor's suffix), and the probe's, pause and ubuntu's and CUDA's stand-in images.
func buildImages(dir string) ([]string, error) {
	archives, err := kubeletnode.ProbeArchives(dir)
	if err != nil {
		return nil, err
	}
	// ubuntu's images, which the examples name, stood in for by the probe answering to
	// bash (their command is bash -c "sleep …"; ubuntu's own default command is bash).
	ubuntu, err := images.Build(images.Spec{Name: "bash", Binary: filepath.Join(dir, "probe")})
	if err != nil {
		return nil, err
	}
	cuda, err := withEnv(ubuntu, "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
	if err != nil {
		return nil, err
	}
	for _, im := range []struct {
		ref string
		img containerregistry.Image
	}{{UbuntuImages[0], ubuntu}, {UbuntuImages[1], ubuntu}, {CUDAImage, cuda}} {
		file := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(im.ref)+".tar")
		if err := images.WriteArchive(file, im.ref, im.img); err != nil {
			return nil, err
		}
		archives = append(archives, file)
	}
	minor, err := kubernetesMinor()
	if err != nil {
		return nil, err
	}
	for _, s := range images.Shipped(dir, imageTag, "test") {
		cmd := exec.Command("go", "build", "-ldflags=-w", "-o", s.Binary, "github.com/dynamig/dynamig/cmd/"+s.Name)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building %s: %w\n%s", s.Name, err, out)
		}
		img, err := images.Build(s)
		if err != nil {
			return nil, err
		}
		tag := imageTag
		if s.Name == "dynamig-scheduler" {
			tag += "-k8s" + minor
		}
		ref := Registry + "/dynamig/" + s.Name + ":" + tag
		file := filepath.Join(dir, s.Name+".tar")
		if err := images.WriteArchive(file, ref, img); err != nil {
			return nil, err
		}
		archives = append(archives, file)
	}
	return archives, nil
}

// withEnv is img with env added to its configuration's environment.
func withEnv(img containerregistry.Image, env ...string) (containerregistry.Image, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	c := cfg.Config.DeepCopy()
	c.Env = append(c.Env, env...)
	return mutate.Config(img, *c)
}

// kubernetesRelease is the k8s.io/kubernetes release built with ("v1.37.2"): the in-process
// API server's, which it does not report (its version is stamped at link time, and a test
// binary is not).
func kubernetesRelease() (*chartutil.KubeVersion, error) {
	v, err := version.KubernetesRelease()
	if err != nil {
		return nil, err
	}
	return chartutil.ParseKubeVersion(v)
}

// kubernetesMinor is "1.37" for kubernetesRelease: the scheduler image's tag suffix, as the
// chart computes it from the cluster's version.
func kubernetesMinor() (string, error) {
	kv, err := kubernetesRelease()
	if err != nil {
		return "", err
	}
	return kv.Major + "." + kv.Minor, nil
}

// Pods lists the pods of dynamig's namespace whose name starts with prefix.
func (c *Cluster) Pods(ctx context.Context, prefix string) ([]v1.Pod, error) {
	list, err := c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []v1.Pod
	for _, p := range list.Items {
		if strings.HasPrefix(p.Name, prefix) {
			out = append(out, p)
		}
	}
	return out, nil
}

// DevicePluginPod is the device plugin pod on node that is not being deleted (nil when
// there is none).
func (c *Cluster) DevicePluginPod(ctx context.Context, node string) (*v1.Pod, error) {
	pods, err := c.Pods(ctx, "dynamig-device-plugin-")
	if err != nil {
		return nil, err
	}
	for _, p := range pods {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			return &p, nil
		}
	}
	return nil, nil
}

// DevicePluginMetrics is the /metrics URL of the device plugin pod on node, at the pod's
// address, as Prometheus scrapes it.
func (c *Cluster) DevicePluginMetrics(ctx context.Context, node string) (string, error) {
	p, err := c.DevicePluginPod(ctx, node)
	if err != nil {
		return "", err
	}
	if p == nil || p.Status.PodIP == "" {
		return "", fmt.Errorf("no running device plugin pod on node %s", node)
	}
	return "http://" + net.JoinHostPort(p.Status.PodIP, "9394") + "/metrics", nil
}

// Instances reads the MIG instances on node from its device plugin's /metrics
// (dynamig_mig_instance lists what NVML reports).
func (c *Cluster) Instances(ctx context.Context, node string) ([]cluster.Instance, error) {
	url, err := c.DevicePluginMetrics(ctx, node)
	if err != nil {
		return nil, err
	}
	return cluster.ScrapeInstances(ctx, url)
}

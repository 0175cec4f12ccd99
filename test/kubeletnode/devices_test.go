package kubeletnode_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/deviceplugin/podresources"
	"github.com/dynamig/dynamig/deviceplugin/server"
	"github.com/dynamig/dynamig/test/kubeletnode"
)

const res = "example.com/dev"

// recorder answers Allocate with nothing and remembers the IDs.
type recorder struct {
	mu  sync.Mutex
	ids []string
}

func (r *recorder) Allocate(_ context.Context, req *pluginapi.ContainerAllocateRequest) (*pluginapi.ContainerAllocateResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, req.DevicesIds...)
	return &pluginapi.ContainerAllocateResponse{}, nil
}

// The device-plugin side of the hand-off through the kubelet, on the real kubelet: here
// rather than in deviceplugin/podresources, so the race run of deviceplugin/... does not
// build the API server with the race detector.

// startPlugin runs the device-plugin server s until the test ends; stop cancels it and
// returns what Run returned (an error if it did not return within 10 s).
func startPlugin(t *testing.T, s *server.Server) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				err = fmt.Errorf("Run did not return within 10 s of its cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// waitFor polls cond every 100 ms until it holds, failing the test after timeout with what
// cond last said.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	var last string
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, s := cond()
		last = s
		return ok, nil
	}); err != nil {
		t.Fatalf("waiting for %s: %s", what, last)
	}
}

// waitDevices waits until the Node reports capacity and allocatable devices of the resource
// (the kubelet's view: capacity counts the unhealthy ones, allocatable only the healthy).
func waitDevices(t *testing.T, client kubernetes.Interface, node, resource string, capacity, allocatable int64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("node %s to report %s capacity %d, allocatable %d", node, resource, capacity, allocatable), time.Minute, func() (bool, string) {
		n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c, a := n.Status.Capacity[v1.ResourceName(resource)], n.Status.Allocatable[v1.ResourceName(resource)]
		return c.Value() == capacity && a.Value() == allocatable, "capacity " + c.String() + ", allocatable " + a.String()
	})
}

// create creates the pod.
func create(t *testing.T, client kubernetes.Interface, p *v1.Pod) *v1.Pod {
	t.Helper()
	created, err := client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// runPod creates p and waits up to timeout until it is Running.
func runPod(t *testing.T, client kubernetes.Interface, p *v1.Pod, timeout time.Duration) *v1.Pod {
	t.Helper()
	created := create(t, client, p)
	waitPhase(t, client, created, v1.PodRunning, timeout)
	return created
}

// waitPhase waits up to timeout until the pod is in phase and returns it as it was then.
func waitPhase(t *testing.T, client kubernetes.Interface, p *v1.Pod, phase v1.PodPhase, timeout time.Duration) *v1.Pod {
	t.Helper()
	var got *v1.Pod
	waitFor(t, "pod "+p.Name+" "+string(phase), timeout, func() (bool, string) {
		var err error
		if got, err = client.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{}); err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == phase, string(got.Status.Phase) + " " + got.Status.Reason + " " + got.Status.Message
	})
	return got
}

// devicePod is a pod for node whose containers ask for the given numbers of res devices
// (0: none), named c0, c1, …; init > 0 adds a plain init container "init" asking for init.
func devicePod(name, node string, init int, containers ...int) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: v1.PodSpec{
		NodeName: node, AutomountServiceAccountToken: ptr.To(false)}}
	c := func(name string, n int) v1.Container {
		c := v1.Container{Name: name, Image: "busybox"}
		if n > 0 {
			c.Resources.Limits = v1.ResourceList{res: *resource.NewQuantity(int64(n), resource.DecimalSI)}
		}
		return c
	}
	if init > 0 {
		p.Spec.InitContainers = []v1.Container{c("init", init)}
	}
	for i, n := range containers {
		p.Spec.Containers = append(p.Spec.Containers, c(fmt.Sprintf("c%d", i), n))
	}
	return p
}

// runDevicePod starts a node named name, serves the devices ids of res on it through
// deviceplugin/server (alloc answers Allocate; preStart, if not nil, makes the PreStarter
// for the node), waits until the Node advertises them, and runs pod p there, asking for one
// device, until it is Running (waiting up to running).
func runDevicePod(t *testing.T, name string, ids []string, alloc server.Allocator, preStart func(*kubeletnode.Node) server.PreStarter, running time.Duration) (*kubeletnode.Node, *v1.Pod) {
	t.Helper()
	node, client := kubeletnode.StartTestNode(t, name)
	var devs []*pluginapi.Device
	for _, id := range ids {
		devs = append(devs, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	opts := server.Options{ResourceName: res, SocketDir: node.DevicePluginDir, Allocator: alloc, Devices: func() []*pluginapi.Device { return devs }}
	if preStart != nil {
		opts.PreStarter = preStart(node)
	}
	srv, err := server.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	startPlugin(t, srv)
	waitDevices(t, client, name, res, int64(len(ids)), int64(len(ids)))
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: v1.PodSpec{
		NodeName: name, AutomountServiceAccountToken: ptr.To(false),
		Containers: []v1.Container{{Name: "main", Image: "busybox", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{res: resource.MustParse("1")}}}},
	}}
	return node, runPod(t, client, p, running)
}

// dialPodResources connects to the node's PodResources socket for the test.
func dialPodResources(t *testing.T, node *kubeletnode.Node) *podresources.Client {
	t.Helper()
	pr, err := podresources.Dial(node.PodResourcesSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pr.Close() })
	return pr
}

// TestFindOnTheRealKubelet: a device plugin registers two devices with the real kubelet, a
// pod gets one, and the kubelet's PodResources API names that pod and container for the ID
// it assigned, and nobody for the other.
func TestFindOnTheRealKubelet(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	node, _ := runDevicePod(t, "pr", []string{"d0", "d1"}, rec, nil, time.Minute)
	rec.mu.Lock()
	ids := append([]string(nil), rec.ids...)
	rec.mu.Unlock()
	if len(ids) != 1 {
		t.Fatalf("Allocate saw %v, want one device", ids)
	}
	pr := dialPodResources(t, node)
	owner, err := pr.Find(ctx, res, ids)
	if err != nil || owner != (podresources.Owner{Namespace: "default", Pod: "p", Container: "main"}) {
		t.Errorf("Find(%v) = %v, %v", ids, owner, err)
	}
	other := map[string]string{"d0": "d1", "d1": "d0"}[ids[0]]
	if _, err := pr.Find(ctx, res, []string{other}); err == nil || !strings.Contains(err.Error(), "no active container holds example.com/dev devices ["+other+"]") {
		t.Errorf("the free device: %v", err)
	}
}

// preStarter asks PodResources, at PreStartContainer, who holds the devices; it fails its
// first call.
type preStarter struct {
	pr     *podresources.Client
	mu     sync.Mutex
	calls  int
	owners []podresources.Owner
	errs   []error
}

func (p *preStarter) PreStartContainer(ctx context.Context, ids []string) error {
	owner, err := p.pr.Find(ctx, res, ids)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	p.owners, p.errs = append(p.owners, owner), append(p.errs, err)
	if p.calls == 1 {
		return fmt.Errorf("not yet")
	}
	return nil
}

// TestOwnerKnownAtPreStart checks on the real kubelet what the hand-off through the kubelet
// rests on: with PreStartRequired, PreStartContainer runs before the container is created,
// PodResources already lists the container with exactly those device IDs, and a failed
// PreStart keeps the container from being created until a later try succeeds.
func TestOwnerKnownAtPreStart(t *testing.T) {
	hook := &preStarter{}
	// The kubelet retries the failed start with a backoff: more time to get Running.
	node, created := runDevicePod(t, "ps", []string{"d0"}, &recorder{}, func(n *kubeletnode.Node) server.PreStarter {
		hook.pr = dialPodResources(t, n)
		return hook
	}, 90*time.Second)
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if hook.calls < 2 {
		t.Fatalf("PreStartContainer called %d times, want the failed try and a later one", hook.calls)
	}
	for i := range hook.calls {
		if hook.errs[i] != nil || hook.owners[i] != (podresources.Owner{Namespace: "default", Pod: "p", Container: "main"}) {
			t.Errorf("PreStart %d: PodResources said %v, %v", i, hook.owners[i], hook.errs[i])
		}
	}
	if n := len(node.Runtime.Created()); n != 1 {
		t.Errorf("%d containers created, want one: none while PreStart failed", n)
	}
	if c, ok := node.Runtime.Latest(created.UID, "main"); !ok || c.Attempt != 0 {
		t.Errorf("container %+v", c)
	}
}

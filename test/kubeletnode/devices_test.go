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

// runDevicePod starts a node named name, serves the devices ids of res on it through
// deviceplugin/server (alloc answers Allocate; preStart, if not nil, makes the PreStarter
// for the node), waits until the Node advertises them, and runs pod p there, asking for one
// device, until it is Running (waiting up to running).
func runDevicePod(t *testing.T, name string, ids []string, alloc server.Allocator, preStart func(*kubeletnode.Node) server.PreStarter, running time.Duration) (*kubeletnode.Node, *v1.Pod) {
	t.Helper()
	ctx := context.Background()
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
	sctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go func() { _ = srv.Run(sctx) }()
	poll := func(what string, timeout time.Duration, cond func() (bool, string)) {
		t.Helper()
		var last string
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
			ok, s := cond()
			last = s
			return ok, nil
		}); err != nil {
			t.Fatalf("waiting for %s: %s", what, last)
		}
	}
	poll("the node to advertise the devices", time.Minute, func() (bool, string) {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		q := n.Status.Allocatable[res]
		return q.Value() == int64(len(ids)), q.String()
	})
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: v1.PodSpec{
		NodeName: name, AutomountServiceAccountToken: ptr.To(false),
		Containers: []v1.Container{{Name: "main", Image: "busybox", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{res: resource.MustParse("1")}}}},
	}}
	created, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll("the pod Running", running, func() (bool, string) {
		got, err := client.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == v1.PodRunning, string(got.Status.Phase) + " " + got.Status.Message
	})
	return node, created
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

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

// TestFindOnTheRealKubelet: a device plugin registers two devices with the real kubelet, a
// pod gets one, and the kubelet's PodResources API names that pod and container for the ID
// it assigned, and nobody for the other.
func TestFindOnTheRealKubelet(t *testing.T) {
	ctx := context.Background()
	node, client := kubeletnode.StartTestNode(t, "pr")
	rec := &recorder{}
	srv, err := server.New(server.Options{ResourceName: res, SocketDir: node.DevicePluginDir, Allocator: rec, Devices: func() []*pluginapi.Device {
		return []*pluginapi.Device{{ID: "d0", Health: pluginapi.Healthy}, {ID: "d1", Health: pluginapi.Healthy}}
	}})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = srv.Run(sctx) }()

	poll := func(what string, cond func() (bool, string)) {
		t.Helper()
		var last string
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			ok, s := cond()
			last = s
			return ok, nil
		}); err != nil {
			t.Fatalf("waiting for %s: %s", what, last)
		}
	}
	poll("the node to advertise the devices", func() (bool, string) {
		n, err := client.CoreV1().Nodes().Get(ctx, "pr", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		q := n.Status.Allocatable[res]
		return q.Value() == 2, q.String()
	})
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: v1.PodSpec{
		NodeName: "pr", AutomountServiceAccountToken: ptr.To(false),
		Containers: []v1.Container{{Name: "main", Image: "busybox", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{res: resource.MustParse("1")}}}},
	}}
	if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the pod Running", func() (bool, string) {
		got, err := client.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == v1.PodRunning, string(got.Status.Phase) + " " + got.Status.Message
	})
	rec.mu.Lock()
	ids := append([]string(nil), rec.ids...)
	rec.mu.Unlock()
	if len(ids) != 1 {
		t.Fatalf("Allocate saw %v, want one device", ids)
	}
	pr, err := podresources.Dial(node.PodResourcesSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
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
	ctx := context.Background()
	node, client := kubeletnode.StartTestNode(t, "ps")
	pr, err := podresources.Dial(node.PodResourcesSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	hook := &preStarter{pr: pr}
	srv, err := server.New(server.Options{ResourceName: res, SocketDir: node.DevicePluginDir, Allocator: &recorder{}, PreStarter: hook,
		Devices: func() []*pluginapi.Device { return []*pluginapi.Device{{ID: "d0", Health: pluginapi.Healthy}} }})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = srv.Run(sctx) }()
	poll := func(what string, cond func() (bool, string)) {
		t.Helper()
		var last string
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
			ok, s := cond()
			last = s
			return ok, nil
		}); err != nil {
			t.Fatalf("waiting for %s: %s", what, last)
		}
	}
	poll("the node to advertise the device", func() (bool, string) {
		n, err := client.CoreV1().Nodes().Get(ctx, "ps", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		q := n.Status.Allocatable[res]
		return q.Value() == 1, q.String()
	})
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: v1.PodSpec{
		NodeName: "ps", AutomountServiceAccountToken: ptr.To(false),
		Containers: []v1.Container{{Name: "main", Image: "busybox", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{res: resource.MustParse("1")}}}},
	}}
	created, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll("the pod Running", func() (bool, string) {
		got, err := client.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == v1.PodRunning, string(got.Status.Phase)
	})
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

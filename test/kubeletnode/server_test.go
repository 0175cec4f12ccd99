package kubeletnode_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dynamig/dynamig/deviceplugin/podresources"
	"github.com/dynamig/dynamig/deviceplugin/server"
	"github.com/dynamig/dynamig/test/kubeletnode"
)

// deviceplugin/server's kubelet-facing behaviour, on the real kubelet: what the kubelet
// makes of the plugin is read from the API (the Node's capacity and allocatable, the pods'
// status) and from the node's runtime (the containers it was asked to create).

// fakeDevices is a device list the test changes, signalling Changed. It counts the calls of
// list: each ListAndWatch stream the kubelet opens calls it once, and once per change.
type fakeDevices struct {
	mu      sync.Mutex
	devs    []*pluginapi.Device
	lists   int
	changed chan struct{}
}

func newFakeDevices(n int) *fakeDevices {
	f := &fakeDevices{changed: make(chan struct{}, 1)}
	for i := range n {
		f.devs = append(f.devs, &pluginapi.Device{ID: fmt.Sprintf("d%d", i), Health: pluginapi.Healthy})
	}
	return f
}

func (f *fakeDevices) list() []*pluginapi.Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	out := make([]*pluginapi.Device, len(f.devs))
	for i, d := range f.devs {
		out[i] = &pluginapi.Device{ID: d.ID, Health: d.Health}
	}
	return out
}

func (f *fakeDevices) listed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lists
}

func (f *fakeDevices) update(fn func(devs []*pluginapi.Device) []*pluginapi.Device) {
	f.mu.Lock()
	f.devs = fn(f.devs)
	f.mu.Unlock()
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

func (f *fakeDevices) setHealth(id, health string) {
	f.update(func(devs []*pluginapi.Device) []*pluginapi.Device {
		for _, d := range devs {
			if d.ID == id {
				d.Health = health
			}
		}
		return devs
	})
}

// fakeAllocator records the device IDs of each container request and answers them in the
// environment variable DEVICES, or fails with err.
type fakeAllocator struct {
	mu    sync.Mutex
	calls [][]string
	err   error
}

func (a *fakeAllocator) Allocate(_ context.Context, req *pluginapi.ContainerAllocateRequest) (*pluginapi.ContainerAllocateResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, slices.Clone(req.DevicesIds))
	if a.err != nil {
		return nil, a.err
	}
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"DEVICES": strings.Join(req.DevicesIds, ",")}}, nil
}

func (a *fakeAllocator) Calls() [][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

func (a *fakeAllocator) setErr(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.err = err
}

// fakePreStarter records the device IDs of each PreStartContainer and fails with err.
type fakePreStarter struct {
	mu    sync.Mutex
	calls [][]string
	err   error
}

func (p *fakePreStarter) PreStartContainer(_ context.Context, ids []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, slices.Clone(ids))
	return p.err
}

func (p *fakePreStarter) Calls() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

func (p *fakePreStarter) setErr(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
}

// newServer makes a server of resource on the node's device-plugin directory.
func newServer(t *testing.T, node *kubeletnode.Node, resource string, devs *fakeDevices, alloc server.Allocator, pre server.PreStarter) *server.Server {
	t.Helper()
	opts := server.Options{ResourceName: resource, SocketDir: node.DevicePluginDir, Devices: devs.list, Changed: devs.changed,
		Allocator: alloc, RegisterRetry: 50 * time.Millisecond}
	if pre != nil {
		opts.PreStarter = pre
	}
	s, err := server.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestServerOnTheRealKubelet: the plugin registers and the Node advertises its devices;
// health changes and new devices reach the Node; an Allocator error fails the pod's
// admission with the Allocator's text and gRPC code, and frees the devices; Allocate gets,
// container by container, the device IDs the kubelet assigned (PodResources names the same
// container for them) and its answer reaches the container; ending Run removes the socket
// and the kubelet stops offering the devices.
func TestServerOnTheRealKubelet(t *testing.T) {
	ctx := context.Background()
	const name = "srv"
	node, client := kubeletnode.StartTestNode(t, name)
	devs, alloc := newFakeDevices(3), &fakeAllocator{}
	s := newServer(t, node, res, devs, alloc, nil)
	stop := startPlugin(t, s)
	if got, want := s.SocketPath(), filepath.Join(node.DevicePluginDir, "dynamig-example.com-dev.sock"); got != want {
		t.Errorf("socket = %s, want %s", got, want)
	}
	waitDevices(t, client, name, res, 3, 3)
	if !s.Registered() {
		t.Error("Registered() is false while the kubelet lists the plugin's devices")
	}

	// Changed sends the new list: an unhealthy device is not allocatable, a new one is.
	devs.setHealth("d1", pluginapi.Unhealthy)
	waitDevices(t, client, name, res, 3, 2)
	devs.update(func(d []*pluginapi.Device) []*pluginapi.Device {
		return append(d, &pluginapi.Device{ID: "d3", Health: pluginapi.Healthy})
	})
	waitDevices(t, client, name, res, 4, 3)
	devs.setHealth("d1", pluginapi.Healthy)
	waitDevices(t, client, name, res, 4, 4)

	// An Allocator error rejects the pod at admission, with the Allocator's text; admission
	// stops at the first failing container.
	alloc.setErr(errors.New("no reservation for pod default/bad"))
	bad := waitPhase(t, client, create(t, client, devicePod("bad", name, 0, 2, 1)), v1.PodFailed, time.Minute)
	if bad.Status.Reason != "UnexpectedAdmissionError" || !strings.Contains(bad.Status.Message, "code = Unknown desc = no reservation for pod default/bad") {
		t.Errorf("bad: %s: %s, want the Allocator's text", bad.Status.Reason, bad.Status.Message)
	}
	if n := len(alloc.Calls()); n != 1 {
		t.Errorf("Allocate calls = %d, want 1 (admission stops at the first error)", n)
	}
	// A gRPC status from the Allocator keeps its code.
	alloc.setErr(status.Error(codes.FailedPrecondition, "busy"))
	bad2 := waitPhase(t, client, create(t, client, devicePod("bad2", name, 0, 2, 1)), v1.PodFailed, time.Minute)
	if !strings.Contains(bad2.Status.Message, "code = FailedPrecondition desc = busy") {
		t.Errorf("bad2: %s: %s, want code FailedPrecondition", bad2.Status.Reason, bad2.Status.Message)
	}
	if n := len(node.Runtime.Created()); n != 0 {
		t.Errorf("%d containers created for pods that failed admission", n)
	}
	alloc.setErr(nil)

	// Allocate gets the kubelet's device IDs, once per container asking for devices, in
	// container order; the failed pods' devices are free again (this pod needs three of four).
	before := len(alloc.Calls())
	multi := create(t, client, devicePod("multi", name, 1, 2, 0, 1))
	waitFor(t, "multi's init container running", time.Minute, func() (bool, string) {
		if _, ok := node.Runtime.Latest(multi.UID, "init"); !ok {
			return false, "not created"
		}
		return node.Runtime.Exit(multi.UID, "init", 0) == nil, "not running"
	})
	waitPhase(t, client, multi, v1.PodRunning, time.Minute)
	calls := alloc.Calls()[before:]
	if len(calls) != 3 || len(calls[0]) != 1 || len(calls[1]) != 2 || len(calls[2]) != 1 {
		t.Fatalf("Allocate calls %v, want init's one device, c0's two and c2's one", calls)
	}
	// A plain init container's device goes on to an app container (the kubelet reuses it).
	if !slices.Contains(calls[1], calls[0][0]) || slices.Contains(calls[1], calls[2][0]) {
		t.Errorf("Allocate calls %v: want init's device reused by c0, c2's its own", calls)
	}
	pr := dialPodResources(t, node)
	for c, want := range map[string]string{"init": strings.Join(calls[0], ","), "c0": strings.Join(calls[1], ","), "c1": "", "c2": strings.Join(calls[2], ",")} {
		if got, ok := node.Runtime.Latest(multi.UID, c); !ok || got.Env["DEVICES"] != want {
			t.Errorf("container %s (created: %v) sees DEVICES=%q, want the Allocate answer for its devices %q", c, ok, got.Env["DEVICES"], want)
		}
	}
	for c, ids := range map[string][]string{"c0": calls[1], "c2": calls[2]} {
		if owner, err := pr.Find(ctx, res, ids); err != nil || owner != (podresources.Owner{Namespace: "default", Pod: "multi", Container: c}) {
			t.Errorf("PodResources on %v: %v, %v; want %s", ids, owner, err, c)
		}
	}

	// Ending Run removes the socket; the kubelet sees the stream end: no device allocatable.
	if err := stop(); err != nil {
		t.Errorf("Run returned %v, want nil", err)
	}
	if _, err := os.Stat(s.SocketPath()); !os.IsNotExist(err) {
		t.Errorf("socket still there after cancel: %v", err)
	}
	if s.Registered() {
		t.Error("Registered() is true after Run ended")
	}
	waitDevices(t, client, name, res, 4, 0)
}

// TestServerPreStartAndKubeletRestart: with a PreStarter the plugin registers
// PreStartRequired: the kubelet calls PreStartContainer with the container's device IDs
// before it creates the container, at every start (a container restart too, which calls no
// Allocate), and a PreStarter error keeps the container from being created and reaches the
// pod's status. After a kubelet restart the plugin registers again on a new socket, as does
// one that started while the kubelet was down; running pods keep their devices and a new pod
// gets the free one.
func TestServerPreStartAndKubeletRestart(t *testing.T) {
	ctx := context.Background()
	const name = "srv2"
	node, client := kubeletnode.StartTestNode(t, name)
	devs, alloc, pre := newFakeDevices(2), &fakeAllocator{}, &fakePreStarter{err: errors.New("the MIG instance is not ready yet")}
	s := newServer(t, node, res, devs, alloc, pre)
	startPlugin(t, s)
	waitDevices(t, client, name, res, 2, 2)

	a := create(t, client, devicePod("a", name, 0, 1))
	waitFor(t, "a's container held back by the PreStarter's error", time.Minute, func() (bool, string) {
		got, err := client.CoreV1().Pods("default").Get(ctx, "a", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, st := range got.Status.ContainerStatuses {
			if w := st.State.Waiting; w != nil {
				return w.Reason == "CreateContainerConfigError" && strings.Contains(w.Message, "the MIG instance is not ready yet"), w.Reason + ": " + w.Message
			}
		}
		return false, fmt.Sprintf("container statuses %+v", got.Status.ContainerStatuses)
	})
	if n := len(node.Runtime.Created()); n != 0 {
		t.Errorf("%d containers created while PreStartContainer failed", n)
	}
	pre.setErr(nil)
	// The kubelet retries the pod with a backoff.
	waitPhase(t, client, a, v1.PodRunning, 90*time.Second)
	ids := alloc.Calls()
	if len(ids) != 1 {
		t.Fatalf("Allocate calls %v, want one", ids)
	}
	calls := pre.Calls()
	if len(calls) < 2 {
		t.Errorf("PreStartContainer calls %v, want the failed one and the one that let the container start", calls)
	}
	for _, c := range calls {
		if !slices.Equal(c, ids[0]) {
			t.Errorf("PreStartContainer got %v, want the container's devices %v", c, ids[0])
		}
	}
	if c, ok := node.Runtime.Latest(a.UID, "c0"); !ok || c.Attempt != 0 || c.Env["DEVICES"] != ids[0][0] || len(node.Runtime.Created()) != 1 {
		t.Errorf("container %+v (of %d created), want one, seeing DEVICES=%s", c, len(node.Runtime.Created()), ids[0][0])
	}

	// A container restart: PreStartContainer again, with the same devices, and no Allocate.
	if err := node.Runtime.Exit(a.UID, "c0", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's container restarted", time.Minute, func() (bool, string) {
		c, _ := node.Runtime.Latest(a.UID, "c0")
		return c.Attempt == 1, fmt.Sprintf("attempt %d", c.Attempt)
	})
	if got := pre.Calls(); len(got) != len(calls)+1 || !slices.Equal(got[len(got)-1], ids[0]) {
		t.Errorf("PreStartContainer calls %v, want one more for the restart, with %v", got, ids[0])
	}
	if c, _ := node.Runtime.Latest(a.UID, "c0"); c.Env["DEVICES"] != ids[0][0] || len(alloc.Calls()) != 1 {
		t.Errorf("restarted container sees DEVICES=%q after %d Allocate calls, want %s after one", c.Env["DEVICES"], len(alloc.Calls()), ids[0][0])
	}
	waitPhase(t, client, a, v1.PodRunning, time.Minute)

	// The kubelet stops; a plugin starting now fails to register until it is back.
	node.StopKubelet()
	late := newServer(t, node, "example.com/late", newFakeDevices(1), &fakeAllocator{}, nil)
	startPlugin(t, late)
	time.Sleep(time.Second)
	if late.Registered() {
		t.Error("a plugin started while the kubelet is down says Registered()")
	}
	lists := devs.listed()
	restarted := time.Now()
	if err := node.RestartKubelet(); err != nil {
		t.Fatal(err)
	}
	// The new kubelet deletes the plugins' sockets; both serve and register again.
	waitFor(t, "the node Ready again, advertising both resources", time.Minute, func() (bool, string) {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready, msg := kubeletnode.Ready(n, restarted)
		d, l := n.Status.Allocatable[res], n.Status.Allocatable["example.com/late"]
		return ready && d.Value() == 2 && l.Value() == 1, fmt.Sprintf("%s; %s %s, example.com/late %s", msg, res, d.String(), l.String())
	})
	// (The socket comes back under its name, maybe with the same inode: the kubelet's new
	// ListAndWatch stream is what shows it registered again.)
	waitFor(t, "the plugin to register again", time.Minute, func() (bool, string) {
		_, err := os.Stat(s.SocketPath())
		return err == nil && devs.listed() > lists && s.Registered() && late.Registered(), fmt.Sprintf("socket: %v; %d device lists sent, %d before the restart; Registered() %t, the late plugin's %t",
			err, devs.listed(), lists, s.Registered(), late.Registered())
	})
	// a keeps running, with no new container; b gets the other device.
	created := len(node.Runtime.Created())
	b := runPod(t, client, devicePod("b", name, 0, 1), time.Minute)
	got, err := client.CoreV1().Pods("default").Get(ctx, "a", metav1.GetOptions{})
	if err != nil || got.Status.Phase != v1.PodRunning || got.Status.ContainerStatuses[0].RestartCount != 1 {
		t.Errorf("a after the kubelet restart: %v, %+v", err, got.Status)
	}
	if n := len(node.Runtime.Created()); n != created+1 {
		t.Errorf("%d containers created after the kubelet restart, want b's only", n-created)
	}
	calls2 := alloc.Calls()
	if len(calls2) != 2 || slices.Equal(calls2[1], ids[0]) {
		t.Errorf("Allocate calls %v, want a second one for b, with the device a does not hold", calls2)
	}
	if c, ok := node.Runtime.Latest(b.UID, "c0"); !ok || len(calls2) < 2 || c.Env["DEVICES"] != strings.Join(calls2[1], ",") {
		t.Errorf("b's container %+v", c)
	}
}

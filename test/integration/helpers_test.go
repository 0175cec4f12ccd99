package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/fixture"
)

// schedulerConfig is the shipped KubeSchedulerConfiguration, which every test runs.
const schedulerConfig = "../../manifests/scheduler-config.yaml"

// heartbeatDuration and heartbeatEvery are the heartbeat Lease's duration and the
// stand-in's renewal period (the device plugin renews every 10 s).
const (
	heartbeatDuration = 40
	heartbeatEvery    = 5 * time.Second
)

// env is one test's slice of the shared control plane: a namespace, its nodes, their
// heartbeats, a stand-in device plugin, and schedulers started by the test.
type env struct {
	t      *testing.T
	ctx    context.Context
	admin  kubernetes.Interface
	dp     kubernetes.Interface // the device plugin's identity
	ns     string
	prefix string

	mu    sync.Mutex
	nodes []string

	standIn *cluster.StandIn
}

func newEnv(t *testing.T, prefix string) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	admin, err := cp.Client(cluster.UserAdmin)
	if err != nil {
		t.Fatal(err)
	}
	dp, err := cp.Client(cluster.UserDevicePlugin)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, admin: admin, dp: dp, ns: "it-" + prefix, prefix: prefix}
	// (It exists already when -count reruns the test on the same control plane.)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var stopStandIn func()
	e.standIn, stopStandIn = cluster.StartStandIn(ctx, dp, e.ns, 16)
	heartbeatsStopped := make(chan struct{})
	go e.renewHeartbeats(ctx, heartbeatsStopped)
	// Cleanups run last-registered first: schedulers (registered later) stop before this.
	t.Cleanup(func() {
		cancel()
		stopStandIn()
		<-heartbeatsStopped
		e.cleanup()
	})
	return e
}

// cleanup removes the test's pods, nodes and heartbeat Leases, so the next test's
// scheduler sees none of them. (The namespace stays: no namespace controller runs to
// finish its deletion.)
func (e *env) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.admin.CoreV1().Pods(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{}); err != nil {
		e.t.Errorf("deleting pods: %v", err)
	}
	e.mu.Lock()
	nodes := slices.Clone(e.nodes)
	e.mu.Unlock()
	for _, n := range nodes {
		if err := e.admin.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			e.t.Errorf("deleting node %s: %v", n, err)
		}
		l := api.HeartbeatLeaseName(n)
		if err := e.admin.CoordinationV1().Leases(api.DefaultSystemNamespace).Delete(ctx, l, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			e.t.Errorf("deleting Lease %s: %v", l, err)
		}
	}
}

// startScheduler runs a dynamig-scheduler from the shipped configuration until the test
// ends or stop is called.
func (e *env) startScheduler() (stop func()) {
	e.t.Helper()
	cfg, err := cp.SchedulerConfig(schedulerConfig)
	if err != nil {
		e.t.Fatal(err)
	}
	stop, err = cluster.StartScheduler(e.ctx, cp, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(stop)
	return stop
}

// addNode registers a node with simulated GPUs of the given models in MIG mode: its
// inventory annotation (computed by the device plugin's inventory code from the simulator),
// its allocatable resources and Ready condition (UpdateStatus, as kubelet does), and a
// fresh heartbeat Lease, renewed until the test ends.
func (e *env) addNode(name string, models ...string) {
	e.t.Helper()
	e.createNode(gpuNode(e.t, name, api.ModeMIG, models...))
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: api.HeartbeatLeaseName(name), Namespace: api.DefaultSystemNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](heartbeatDuration),
			AcquireTime: &now, RenewTime: &now},
	}
	if _, err := e.dp.CoordinationV1().Leases(api.DefaultSystemNamespace).Create(e.ctx, lease, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// createNode creates node with its status (UpdateStatus, as kubelet does), removed when the
// test ends.
func (e *env) createNode(node *v1.Node) {
	e.t.Helper()
	status := node.Status
	created, err := e.admin.CoreV1().Nodes().Create(e.ctx, node, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	e.nodes = append(e.nodes, node.Name)
	e.mu.Unlock()
	created.Status = status
	if _, err := e.admin.CoreV1().Nodes().UpdateStatus(e.ctx, created, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) renewHeartbeats(ctx context.Context, stopped chan<- struct{}) {
	defer close(stopped)
	tick := time.NewTicker(heartbeatEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		e.mu.Lock()
		nodes := slices.Clone(e.nodes)
		e.mu.Unlock()
		leases := e.dp.CoordinationV1().Leases(api.DefaultSystemNamespace)
		for _, n := range nodes {
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				l, err := leases.Get(ctx, api.HeartbeatLeaseName(n), metav1.GetOptions{})
				if err != nil {
					return err
				}
				now := metav1.NewMicroTime(time.Now())
				l.Spec.RenewTime = &now
				_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
				return err
			})
			if err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) { // a node without dynamig
				e.t.Logf("renewing the heartbeat of %s: %v", n, err)
			}
		}
	}
}

// gpuNode is a Ready node with the inventory of simulated GPUs in mode.
func gpuNode(t *testing.T, name, mode string, models ...string) *v1.Node {
	return fixture.Node(t, name, mode, models...)
}

// gpuPod is a pod of the test's namespace for dynamig-scheduler whose containers ask for
// {devices, MiB per device}, in mode.
func (e *env) gpuPod(name, mode string, containers ...[2]int) *v1.Pod {
	return fixture.GPUPod(e.ns, name, mode, containers...)
}

// burst creates n identical MIG pods named prefix-00, prefix-01, …, each asking for one
// device of mib, and returns their names.
func (e *env) burst(prefix string, n, mib int) []string {
	e.t.Helper()
	var names []string
	for i := range n {
		p := e.gpuPod(fmt.Sprintf("%s-%02d", prefix, i), api.ModeMIG, [2]int{1, mib})
		names = append(names, p.Name)
		e.create(p)
	}
	return names
}

func (e *env) create(pods ...*v1.Pod) {
	e.t.Helper()
	for _, p := range pods {
		if _, err := e.admin.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
			e.t.Fatalf("creating pod %s: %v", p.Name, err)
		}
	}
}

func (e *env) pods() []v1.Pod {
	e.t.Helper()
	list, err := e.admin.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return list.Items
}

func (e *env) pod(name string) *v1.Pod {
	e.t.Helper()
	p, err := e.admin.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// waitFor polls cond every 200 ms until it holds or timeout passes; then it fails the test
// with what describe says.
func (e *env) waitFor(timeout time.Duration, what string, cond func() (bool, string)) {
	e.t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(e.ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, msg := cond()
		last = msg
		return ok, nil
	})
	if err != nil {
		e.t.Fatalf("waiting %s for %s: %v; last state: %s", timeout, what, err, last)
	}
}

// waitRealised waits until the named pods are bound and the stand-in has realised them
// (bind-phase success, written with the runtime identity in its one patch).
func (e *env) waitRealised(timeout time.Duration, names ...string) {
	e.t.Helper()
	e.waitFor(timeout, fmt.Sprintf("%d pods bound and realised", len(names)), func() (bool, string) {
		byName := map[string]v1.Pod{}
		for _, p := range e.pods() {
			byName[p.Name] = p
		}
		var missing []string
		for _, n := range names {
			p, ok := byName[n]
			if !ok || p.Spec.NodeName == "" || p.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
				missing = append(missing, fmt.Sprintf("%s(node=%q phase=%q %s)", n, p.Spec.NodeName, p.Annotations[api.BindPhaseAnnotation], scheduledMessage(&p)))
			}
		}
		return len(missing) == 0, "not yet: " + strings.Join(missing, ", ")
	})
}

// scheduledMessage is the pod's PodScheduled=False condition message, if any.
func scheduledMessage(p *v1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// reservations decodes a pod's MIG reservation; ok is false when it has none.
func reservations(t *testing.T, p *v1.Pod) ([]api.MigReservation, bool) {
	t.Helper()
	raw, ok := p.Annotations[api.MigReservationsAnnotation]
	if !ok {
		return nil, false
	}
	recs, err := api.DecodeMigReservations(raw)
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	return recs, true
}

// checkPlacements fails the test when a bound pod lacks a reservation for every device it
// asked for, or when two reservations overlap on one GPU. It returns the number of bound
// pods.
func checkPlacements(t *testing.T, pods []v1.Pod) int {
	t.Helper()
	type owned struct {
		pod string
		rec api.MigReservation
	}
	byGPU := map[string][]owned{}
	bound := 0
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" {
			if _, ok := p.Annotations[api.MigReservationsAnnotation]; ok {
				t.Errorf("pod %s is unbound but carries a reservation", p.Name)
			}
			continue
		}
		bound++
		recs, ok := reservations(t, p)
		if !ok {
			t.Errorf("pod %s is bound to %s without %s", p.Name, p.Spec.NodeName, api.MigReservationsAnnotation)
			continue
		}
		want := 0
		for _, c := range p.Spec.Containers {
			q := c.Resources.Limits[api.ResourceCount]
			want += int(q.Value())
		}
		if len(recs) != want {
			t.Errorf("pod %s asks for %d devices and has %d reservations: %v", p.Name, want, len(recs), recs)
		}
		for _, r := range recs {
			key := p.Spec.NodeName + "/" + r.GPUUUID
			for _, o := range byGPU[key] {
				if r.Placement.Start < o.rec.Placement.End() && o.rec.Placement.Start < r.Placement.End() {
					t.Errorf("overlap on %s: %s %s%s and %s %s%s", key, p.Name, r.Profile, r.Placement, o.pod, o.rec.Profile, o.rec.Placement)
				}
			}
			byGPU[key] = append(byGPU[key], owned{pod: p.Name, rec: r})
		}
	}
	return bound
}

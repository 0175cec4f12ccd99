package dynamicmig

import (
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
)

// TestHandoffAwareScoring: binpack sends a second GPU pod to the node already in use,
// unless that node's hand-off is in progress (a reservation not yet bound, or a Lease
// whose holder is not realised), in which case an idle node wins; with the option off,
// binpack wins regardless.
func TestHandoffAwareScoring(t *testing.T) {
	for _, tc := range []struct {
		name  string
		aware bool
		// bound: the first pod is bound and holds the Lease; otherwise it is only reserved.
		bound    bool
		released bool
		wantSame bool
	}{
		{name: "reserved, aware", aware: true, wantSame: false},
		{name: "bound and holding the Lease, aware", aware: true, bound: true, wantSame: false},
		{name: "bound, Lease released, aware", aware: true, bound: true, released: true, wantSame: true},
		{name: "reserved, not aware", aware: false, wantSame: true},
		{name: "bound and holding the Lease, not aware", aware: false, bound: true, wantSame: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := []*v1.Node{gpuNode(t, "n1", api.ModeMIG, "A100-40GB"), gpuNode(t, "n2", api.ModeMIG, "A100-40GB")}
			e := newEnv(t, &config.DynamicMIGArgs{HandoffAwareScoring: ptr.To(tc.aware)}, nodes)
			e.realise = false
			first := gpuPod("first", api.ModeMIG, [2]int{1, 4000})
			if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, first, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			state, node, statuses := e.cycle(first)
			if node == "" {
				t.Fatalf("first pod unschedulable: %s", reasons(statuses))
			}
			assumed := first.DeepCopy()
			assumed.Spec.NodeName = node
			if tc.bound {
				if st := e.fw.RunBindPlugins(e.ctx, state, first, node); !st.IsSuccess() {
					t.Fatal(st.AsError())
				}
				e.pl.reservations.remove(first.UID) // the scheduler cache now shows it bound
				if tc.released {
					l, err := e.client.CoordinationV1().Leases(api.DefaultSystemNamespace).Get(e.ctx, api.HandoffLeaseName(node), metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					l.Spec.HolderIdentity = nil
					if _, err := e.client.CoordinationV1().Leases(api.DefaultSystemNamespace).Update(e.ctx, l, metav1.UpdateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				waitFor(t, func() bool { return e.pl.handoffBusy(node) == !tc.released })
			}
			second := gpuPod("second", api.ModeMIG, [2]int{1, 4000})
			if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, second, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			_, node2, statuses := e.cycle(second, assumed)
			if node2 == "" {
				t.Fatalf("second pod unschedulable: %s", reasons(statuses))
			}
			if (node2 == node) != tc.wantSame {
				t.Errorf("first pod on %s, second on %s; want the same node: %v", node, node2, tc.wantSame)
			}
		})
	}
}

// TestBindReadsLeaseFromInformerAndWakesOnRelease: a Bind waiting for another pod's
// hand-off reads neither the Lease nor its holder from the API server, and proceeds as
// soon as the holder's release reaches the Lease informer.
func TestBindReadsLeaseFromInformerAndWakesOnRelease(t *testing.T) {
	e := newEnv(t, &config.DynamicMIGArgs{HandoffAwareScoring: ptr.To(false)}, []*v1.Node{gpuNode(t, "n1", api.ModeMIG, "A100-40GB")})
	first := bindUnrealised(t, e, "first")
	waitFor(t, func() bool { return e.pl.handoffBusy("n1") })
	e.client.ClearActions()

	second := gpuPod("second", api.ModeMIG, [2]int{1, 4000})
	if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, second, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	state, node, statuses := e.cycle(second, first)
	if node != "n1" {
		t.Fatalf("second pod: node %q, %s", node, reasons(statuses))
	}
	done := make(chan error, 1)
	go func() { done <- e.fw.RunBindPlugins(e.ctx, state, second, node).AsError() }()
	select {
	case err := <-done:
		t.Fatalf("the second Bind did not wait for the first pod's hand-off: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	released := time.Now()
	l, err := e.client.CoordinationV1().Leases(api.DefaultSystemNamespace).Get(e.ctx, api.HandoffLeaseName("n1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderIdentity = nil
	if _, err := e.client.CoordinationV1().Leases(api.DefaultSystemNamespace).Update(e.ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second Bind did not proceed after the release")
	}
	// The backoff has grown past 300 ms by now: only the Lease event explains a prompt bind.
	if d := time.Since(released); d > 250*time.Millisecond {
		t.Errorf("the second Bind took %v after the release; want it woken by the Lease event", d)
	}
	gets := 0
	for _, a := range e.client.Actions() {
		switch {
		case a.GetVerb() == "get" && a.GetResource().Resource == "pods":
			t.Errorf("Bind read the holder pod from the API server: %v", a)
		case a.GetVerb() == "get" && a.GetResource().Resource == "leases":
			gets++
		}
	}
	if gets != 1 {
		t.Errorf("Lease reads from the API server: %d, want only the test's own", gets)
	}
}

// TestFitCacheFollowsNodeInfoGeneration: Filter reuses a node's fit for the same request
// and NodeInfo generation, and recomputes it once a pod lands on the node or the request
// differs.
func TestFitCacheFollowsNodeInfoGeneration(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n1", api.ModeMIG, "A100-40GB")})
	filter := func(pod *v1.Pod, ni fwk.NodeInfo) *nodeFit {
		t.Helper()
		state := framework.NewCycleState()
		if _, st := e.pl.PreFilter(e.ctx, state, pod, []fwk.NodeInfo{ni}); !st.IsSuccess() {
			t.Fatal(st.AsError())
		}
		if st := e.pl.Filter(e.ctx, state, pod, ni); !st.IsSuccess() {
			t.Fatal(st.AsError())
		}
		s, _ := readState(state)
		f, _ := s.fit("n1")
		return f
	}
	ni := framework.NewNodeInfo()
	ni.SetNode(e.nodes[0])
	small := gpuPod("small", api.ModeMIG, [2]int{1, 4000})
	first := filter(small, ni)
	if again := filter(gpuPod("small-2", api.ModeMIG, [2]int{1, 4000}), ni); again != first {
		t.Errorf("same request, same generation: fit recomputed")
	}
	bound := small.DeepCopy()
	bound.Spec.NodeName = "n1"
	raw, err := api.EncodeMigReservations([]api.MigReservation{{GPUUUID: first.result.Assignments[0].GPUUUID, Profile: "1g.5gb", Placement: first.result.Assignments[0].Placement}})
	if err != nil {
		t.Fatal(err)
	}
	bound.Annotations[api.MigReservationsAnnotation] = raw
	ni.AddPod(bound)
	next := filter(gpuPod("small-3", api.ModeMIG, [2]int{1, 4000}), ni)
	if next == first || next.result.Assignments[0].Placement == first.result.Assignments[0].Placement {
		t.Errorf("after a pod landed, the fit is still %v", next.result.Assignments[0].Placement)
	}
	if other := filter(gpuPod("big", api.ModeMIG, [2]int{1, 9000}), ni); other == next || other.result.Assignments[0].Profile != "2g.10gb" {
		t.Errorf("another request got the cached fit %+v", other.result.Assignments)
	}
}

// TestHandoffTimeoutCountsFromTheNodesTurn: a Bind waiting for a holder that is never
// realised fails after handoffTimeout, naming the Lease; a Bind queued behind it on the
// same node gets its own full timeout from its turn, not from its arrival.
func TestHandoffTimeoutCountsFromTheNodesTurn(t *testing.T) {
	const timeout = 400 * time.Millisecond
	e := newEnv(t, &config.DynamicMIGArgs{HandoffAwareScoring: ptr.To(false), HandoffTimeout: &metav1.Duration{Duration: timeout}},
		[]*v1.Node{gpuNode(t, "n1", api.ModeMIG, "A100-40GB")})
	holder := bindUnrealised(t, e, "holder")
	assumed := []*v1.Pod{holder}
	type outcome struct {
		err error
		at  time.Time
	}
	results := make(chan outcome, 2)
	start := time.Now()
	for _, name := range []string{"second", "third"} {
		p := gpuPod(name, api.ModeMIG, [2]int{1, 4000})
		if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		state, node, statuses := e.cycle(p, assumed...)
		if node == "" {
			t.Fatalf("%s unschedulable: %s", name, reasons(statuses))
		}
		a := p.DeepCopy()
		a.Spec.NodeName = node
		assumed = append(assumed, a)
		go func() {
			err := e.fw.RunBindPlugins(e.ctx, state, p, node).AsError()
			results <- outcome{err, time.Now()}
		}()
	}
	for range 2 {
		r := <-results
		if r.err == nil || !strings.Contains(r.err.Error(), "timed out after 400ms waiting for hand-off Lease dynamig-system/dynamig-handoff-n1") {
			t.Errorf("bind error %v, want a hand-off timeout naming the Lease", r.err)
		}
		if d := r.at.Sub(start); d < timeout {
			t.Errorf("a bind gave up after %v, before the timeout", d)
		}
	}
	if d := time.Since(start); d < 2*timeout {
		t.Errorf("both binds gave up within %v: the second must wait its own %v after the first", d, timeout)
	}
}

// TestLeaseTimes: the per-node heartbeat and hand-off expiries follow Lease adds, updates
// and deletes (tombstones included); a hand-off Lease without a holder is not held.
func TestLeaseTimes(t *testing.T) {
	now := time.Now()
	lease := func(name string, holder *string, renewed time.Time) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: api.DefaultSystemNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: holder, LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &metav1.MicroTime{Time: renewed}}}
	}
	lt := newLeaseTimes()
	lt.set(lease(api.HeartbeatLeaseName("n1"), ptr.To("n1"), now))
	lt.set(lease(api.HeartbeatLeaseName("n2"), ptr.To("n2"), now.Add(-time.Minute)))
	lt.set(lease(api.HandoffLeaseName("n1"), ptr.To("default/p/uid"), now))
	lt.set(lease(api.HandoffLeaseName("n2"), nil, now))
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"n1 heartbeat fresh", lt.heartbeatFresh("n1", now), true},
		{"n2 heartbeat expired", lt.heartbeatFresh("n2", now), false},
		{"n3 no heartbeat", lt.heartbeatFresh("n3", now), false},
		{"n1 hand-off held", lt.handoffHeld("n1", now), true},
		{"n1 hand-off expired later", lt.handoffHeld("n1", now.Add(time.Minute)), false},
		{"n2 hand-off without holder", lt.handoffHeld("n2", now), false},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	pl := &DynamicMIG{leaseTimes: lt}
	pl.onLeaseDelete(cache.DeletedFinalStateUnknown{Key: "x", Obj: lease(api.HandoffLeaseName("n1"), ptr.To("default/p/uid"), now)})
	pl.onLeaseDelete(lease(api.HeartbeatLeaseName("n1"), ptr.To("n1"), now))
	if lt.handoffHeld("n1", now) || lt.heartbeatFresh("n1", now) {
		t.Error("deleted Leases still count")
	}
}

// bindUnrealised schedules and binds a 1g pod that the device plugin never realises (so it
// keeps the node's hand-off Lease) and waits until the plugin's pod informer shows it bound.
func bindUnrealised(t *testing.T, e *env, name string) *v1.Pod {
	t.Helper()
	e.realise = false
	if bound, statuses := e.schedule(gpuPod(name, api.ModeMIG, [2]int{1, 4000})); bound == nil {
		t.Fatalf("%s unschedulable: %s", name, reasons(statuses))
	}
	waitFor(t, func() bool {
		p, err := e.pl.pods.Pods("default").Get(name)
		return err == nil && p.Spec.NodeName != ""
	})
	return e.pod(name)
}

func TestNewerVersion(t *testing.T) {
	at := func(rv string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv}}
	}
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"10", "9", true},
		{"9", "10", false},
		{"10", "10", false},
		{"", "9", false},
		{"10", "", false},
		{"x", "9", false},
	} {
		if got := newerVersion(at(tc.a), at(tc.b)); got != tc.want {
			t.Errorf("newerVersion(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

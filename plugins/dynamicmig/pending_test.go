package dynamicmig

import (
	"maps"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/api"
)

// pendingGauge is dynamig_scheduler_pending_pods as a scrape shows it now, by reason, the
// reasons with no pod left out.
func pendingGauge(t *testing.T) map[string]float64 {
	t.Helper()
	families, err := Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "dynamig_scheduler_pending_pods" {
			continue
		}
		for _, m := range f.GetMetric() {
			if v := m.GetGauge().GetValue(); v > 0 {
				out[m.GetLabel()[0].GetValue()] = v
			}
		}
	}
	return out
}

// waitForPending waits until the gauge shows want: the collector reads pods through the
// informer.
func waitForPending(t *testing.T, want map[string]float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for got := pendingGauge(t); !maps.Equal(got, want); got = pendingGauge(t) {
		if time.Now().After(deadline) {
			t.Fatalf("pending pods %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// attempts is how many pods' attempts the plugin holds.
func attempts(e *env) int {
	e.pl.pending.mu.Lock()
	defer e.pl.pending.mu.Unlock()
	return len(e.pl.pending.attempts)
}

// TestPendingPodsByReason: a GPU pod that fits nowhere counts under the closest reason over
// the nodes: an allocator's reason beats a node without inventory or heartbeat; a request
// PreFilter refuses counts as invalid; a deleted pod no longer counts.
func TestPendingPodsByReason(t *testing.T) {
	cpu := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}}
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "full", api.ModeMIG, "A100-40GB"), gpuNode(t, "stale", api.ModeMIG, "A100-40GB"), cpu})
	e.mustSchedule(gpuPod("filler-1", api.ModeMIG, [2]int{1, 40000}))
	e.mustSchedule(gpuPod("filler-2", api.ModeMIG, [2]int{1, 40000}))
	waitForPending(t, map[string]float64{})
	if _, err := e.client.CoordinationV1().Leases(api.DefaultSystemNamespace).Update(e.ctx, heartbeat("stale", time.Now().Add(-time.Hour)), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !e.pl.leaseTimes.heartbeatFresh("stale", time.Now()) })

	p, statuses := e.schedule(gpuPod("p", api.ModeMIG, [2]int{1, 4000}))
	if p != nil {
		t.Fatal("p must not fit")
	}
	full := statuses["full"].Reasons()[0]
	if statuses["stale"].Reasons()[0] != reasonHeartbeat || statuses["cpu"].Reasons()[0] != notPreFiltered {
		t.Fatalf("unexpected refusals: %s", reasons(statuses))
	}
	waitForPending(t, map[string]float64{full: 1})

	if p, _ := e.schedule(gpuPod("too-big", api.ModeMIG, [2]int{1, 500000})); p != nil {
		t.Fatal("too-big must not fit")
	}
	waitForPending(t, map[string]float64{full: 1, reasonInvalidRequest: 1})

	if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForPending(t, map[string]float64{reasonInvalidRequest: 1})
	waitFor(t, func() bool { return attempts(e) == 1 })
}

// TestPendingPodsThroughBinding: a reserved pod counts as binding, as not refused once
// Unreserve released it, and not at all once bound.
func TestPendingPodsThroughBinding(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	pod := gpuPod("a", api.ModeMIG, [2]int{1, 4000})
	if _, err := e.client.CoreV1().Pods(pod.Namespace).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	state, node, _ := e.cycle(pod)
	if node != "n" {
		t.Fatal("a must fit")
	}
	waitForPending(t, map[string]float64{reasonBinding: 1})
	e.fw.RunReservePluginsUnreserve(e.ctx, state, pod, node)
	waitForPending(t, map[string]float64{reasonNotRefused: 1})

	state, node, _ = e.cycle(pod)
	if st := e.fw.RunBindPlugins(e.ctx, state, pod, node); !st.IsSuccess() {
		t.Fatalf("bind: %v", st)
	}
	waitForPending(t, map[string]float64{})
	if attempts(e) != 0 {
		t.Errorf("a bound pod's attempt is kept")
	}
}

// TestAttemptNoteConcurrent: nodes noting outcomes in parallel leave the most hopeful.
func TestAttemptNoteConcurrent(t *testing.T) {
	var a attempt
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.note(int32(i % int(rankFit+1)))
		}()
	}
	wg.Wait()
	if a.rank.Load() != rankFit {
		t.Errorf("rank %d, want %d", a.rank.Load(), rankFit)
	}
	if len(pendingReasons) != int(rankFit)+1 {
		t.Errorf("%d reasons for %d ranks", len(pendingReasons), rankFit+1)
	}
}

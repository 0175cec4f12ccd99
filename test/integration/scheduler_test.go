package integration

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/signing"
	"github.com/dynamig/dynamig/test/cluster"
)

const a100 = "NVIDIA A100-PCIE-40GB"

// HAMi's dynamic-MIG example (examples/gpu-pod1.yaml) through the whole control plane: a pod asking for two
// 8000 MiB MIG devices on an empty A100-40GB gets two disjoint 2g.10gb instances, with one
// scheduler write (the Binding, carrying the signed reservation) and one device-plugin write
// (the stand-in's patch: the runtime identity and bind-phase success).
func TestGPUPodEndToEnd(t *testing.T) {
	e := newEnv(t, "e2e")
	node := "e2e-node"
	e.addNode(node, a100)
	// Counting starts before the scheduler does: whatever it writes from its start on is
	// in the window. It starts after the node and its heartbeat exist, so its first
	// scheduling cycle for the pod sees them (the initial List precedes scheduling) and no
	// retry (with its status patch) can happen.
	since := time.Now()
	e.startScheduler()
	bindingsBefore := bindingCreates(t)

	pod := e.gpuPod("gpu-pod1", api.ModeMIG, [2]int{2, 8000})
	e.create(pod)
	e.waitRealised(60*time.Second, pod.Name)

	got := e.pod(pod.Name)
	if got.Spec.NodeName != node {
		t.Fatalf("bound to %q, want %q", got.Spec.NodeName, node)
	}
	recs, ok := reservations(t, got)
	if !ok {
		t.Fatalf("bound without %s: %v", api.MigReservationsAnnotation, got.Annotations)
	}
	if len(recs) != 2 {
		t.Fatalf("reservations: %v, want two", recs)
	}
	for _, r := range recs {
		if r.Profile != "2g.10gb" || r.ContainerIndex != 0 {
			t.Errorf("reservation %+v: want 2g.10gb for container 0", r)
		}
		// The stand-in wrote the runtime identity in the same patch as bind-phase success.
		if !r.Realized() {
			t.Errorf("reservation %+v: bind-phase success without the runtime identity", r)
		}
	}
	if recs[0].DeviceIndex == recs[1].DeviceIndex {
		t.Errorf("both reservations have device index %d", recs[0].DeviceIndex)
	}
	checkPlacements(t, []v1.Pod{*got})
	if got.Annotations[api.AssignedNodeAnnotation] != node || got.Annotations[api.BindTimeAnnotation] == "" {
		t.Errorf("binding annotations: %v", got.Annotations)
	}
	// Signed by the key the scheduler published when it started; the signature still
	// verifies with the runtime identity written back.
	keys, err := e.admin.CoreV1().ConfigMaps(api.DefaultSystemNamespace).Get(e.ctx, api.PublicKeysConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pubs, err := signing.PublicKeys(keys)
	if err != nil || len(pubs) == 0 {
		t.Fatalf("published keys %v, %v", pubs, err)
	}
	if err := signing.NewStaticVerifier(slices.Collect(maps.Values(pubs))...).Verify(got); err != nil {
		t.Error(err)
	}

	// Writes are counted at the API server, per client identity: the scheduler runs with
	// its own bearer token (user cluster.UserScheduler), the test as cluster.UserAdmin and
	// the stand-in device plugin as cluster.UserDevicePlugin, and the server's audit log
	// records every completed write (stage ResponseComplete) with its user. So the
	// scheduler's writes are exactly the audit events of that user since it started: no
	// subtraction of our own writes, no client-side counting. Events are writes too, but
	// not writes to the pod: they are listed apart and not counted.
	var writes, events []string
	e.waitFor(10*time.Second, "the scheduler's writes in the audit log", func() (bool, string) {
		writes, events = schedulerWrites(t, since)
		return len(writes) >= 1, strings.Join(writes, "; ")
	})
	// The audit record is written as the response completes: give a second write (which
	// must not exist) time to show up.
	time.Sleep(time.Second)
	writes, events = schedulerWrites(t, since)
	wantWrites := []string{"create pods/binding " + e.ns + "/" + pod.Name}
	if strings.Join(writes, "\n") != strings.Join(wantWrites, "\n") {
		t.Errorf("scheduler writes for one GPU pod, counted at the API server (audit log, user %s; events excluded: they are not writes to the pod, %d seen: %v):\n got %d: %q\nwant 1 (the Binding): %q",
			cluster.UserScheduler, len(events), events, len(writes), writes, wantWrites)
	}
	// Cross-check with the API server's own request counter, which has no user label:
	// only the scheduler creates Bindings, and it created one.
	if d := bindingCreates(t) - bindingsBefore; d != 1 {
		t.Errorf("apiserver_request_total{verb=POST,resource=pods,subresource=binding} grew by %d, want 1", d)
	}
	if n := e.standIn.Writes(); n != 1 {
		t.Errorf("stand-in device plugin writes: %d, want 1 (the runtime identity and bind-phase success in one patch)", n)
	}
}

// schedulerWrites lists the writes the scheduler's identity made since since, as
// "verb resource[/subresource] namespace/name", events apart; the one-time setup of its
// signing key is not a write for a pod.
func schedulerWrites(t *testing.T, since time.Time) (writes, events []string) {
	t.Helper()
	evs, err := cp.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Stage != auditv1.StageResponseComplete || ev.User.Username != cluster.UserScheduler || ev.RequestReceivedTimestamp.Time.Before(since) || cluster.SigningKeySetup(ev) {
			continue
		}
		s := ev.Verb + " " + ev.RequestURI
		if r := ev.ObjectRef; r != nil {
			res := r.Resource
			if r.Subresource != "" {
				res += "/" + r.Subresource
			}
			s = fmt.Sprintf("%s %s %s/%s", ev.Verb, res, r.Namespace, r.Name)
			if r.Resource == "events" {
				events = append(events, s)
				continue
			}
		}
		writes = append(writes, s)
	}
	return writes, events
}

// bindingCreates is the API server's count of Binding creations (all codes).
func bindingCreates(t *testing.T) int {
	t.Helper()
	text, err := cp.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "apiserver_request_total{") || !strings.Contains(l, `resource="pods"`) ||
			!strings.Contains(l, `subresource="binding"`) || !strings.Contains(l, `verb="POST"`) {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		n += int(v)
	}
	return n
}

// A new scheduler learns the occupancy from the pods' reservation annotations, realised or
// not: after a restart it places new pods only on free placements (none overlapping the
// reservations the old one wrote, those of a pod still being realised included), binds
// them without waiting for that pod's realisation, and refuses once the GPUs are full.
func TestSchedulerRestartNoDoubleBooking(t *testing.T) {
	e := newEnv(t, "restart")
	const node = "restart-node"
	e.addNode(node, a100, a100)
	// 2g.10gb: three instances per A100-40GB (placements [0,2) [2,4) [4,6)), six on the node.
	var first, second []string
	stop := e.startScheduler()
	for i := range 3 {
		p := e.gpuPod(fmt.Sprintf("before-%d", i), api.ModeMIG, [2]int{1, 8000})
		first = append(first, p.Name)
		e.create(p)
	}
	e.waitRealised(60*time.Second, first...)
	// One more pod is bound but not yet realised when the scheduler stops: its reservation
	// is on the pod, bind-phase allocating.
	e.standIn.Pause()
	e.create(e.gpuPod("inflight", api.ModeMIG, [2]int{1, 8000}))
	e.waitFor(60*time.Second, "inflight bound", func() (bool, string) {
		p := e.pod("inflight")
		return p.Spec.NodeName != "", fmt.Sprintf("node %q %s", p.Spec.NodeName, scheduledMessage(p))
	})
	stop()

	e.startScheduler()
	for i := range 2 {
		p := e.gpuPod(fmt.Sprintf("after-%d", i), api.ModeMIG, [2]int{1, 8000})
		second = append(second, p.Name)
		e.create(p)
	}
	// Nothing waits for inflight's realisation: the new pods are bound while it is still
	// allocating, on placements free of every reservation, its own included.
	e.waitFor(60*time.Second, "the new pods bound while inflight is allocating", func() (bool, string) {
		var missing []string
		for _, n := range second {
			if p := e.pod(n); p.Spec.NodeName == "" {
				missing = append(missing, fmt.Sprintf("%s(%s)", n, scheduledMessage(p)))
			}
		}
		return len(missing) == 0, "not bound: " + strings.Join(missing, ", ")
	})
	if p := e.pod("inflight"); p.Annotations[api.BindPhaseAnnotation] != api.BindPhaseAllocating {
		t.Errorf("inflight: bind-phase %q while the stand-in is paused, want %q", p.Annotations[api.BindPhaseAnnotation], api.BindPhaseAllocating)
	}
	if bound := checkPlacements(t, e.pods()); bound != 6 {
		t.Errorf("bound pods: %d, want 6", bound)
	}
	if err := e.standIn.Resume(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.waitRealised(60*time.Second, append(second, "inflight")...)
	// The node is full for 2g.10gb: a seventh pod must stay Pending.
	e.create(e.gpuPod("one-too-many", api.ModeMIG, [2]int{1, 8000}))
	msg := e.waitPending("one-too-many")
	if !hasDynamicMIGReason(msg) {
		t.Errorf("one-too-many is Pending with %q, which names no DynamicMIG reason", msg)
	}
	if bound := checkPlacements(t, e.pods()); bound != 6 {
		t.Errorf("bound pods: %d, want 6", bound)
	}
}

// waitPending waits until the scheduler has marked the pod unschedulable and returns the
// condition's message; the pod must not be bound.
func (e *env) waitPending(name string) string {
	e.t.Helper()
	var msg string
	e.waitFor(60*time.Second, name+" marked unschedulable", func() (bool, string) {
		p := e.pod(name)
		if p.Spec.NodeName != "" {
			e.t.Fatalf("%s was bound to %s: %v", name, p.Spec.NodeName, p.Annotations[api.MigReservationsAnnotation])
		}
		msg = scheduledMessage(p)
		return msg != "", fmt.Sprintf("conditions %v", p.Status.Conditions)
	})
	return msg
}

// hasDynamicMIGReason reports whether msg names one of the plugin's refusal reasons.
func hasDynamicMIGReason(msg string) bool {
	for _, r := range []placement.Reason{placement.ReasonNoGPU, placement.ReasonNotSelected, placement.ReasonNoMIGGPU,
		placement.ReasonNoProfile, placement.ReasonShareLimit, placement.ReasonPlacementsTaken,
		placement.ReasonInstanceLimit, placement.ReasonFragmented} {
		if strings.Contains(msg, string(r)) {
			return true
		}
	}
	return false
}

// No pod is ever seen bound without its reservation: the reservation travels on the
// Binding, so the node and the annotation appear in one write. A pod that cannot fit stays
// Pending and says why.
func TestAtomicBind(t *testing.T) {
	e := newEnv(t, "atomic")
	const burst = 12
	e.addNode("atomic-a", a100, a100)
	e.addNode("atomic-b", a100, a100)

	list, err := e.admin.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := e.admin.CoreV1().Pods(e.ns).Watch(e.ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu         sync.Mutex
		violations []string
		seenBound  = map[string]bool{}
	)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*v1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			if p.Spec.NodeName == "" {
				continue
			}
			mu.Lock()
			seenBound[p.Name] = true
			if _, has := p.Annotations[api.MigReservationsAnnotation]; !has {
				violations = append(violations, fmt.Sprintf("%s %s at resourceVersion %s: node %s, annotations %v", ev.Type, p.Name, p.ResourceVersion, p.Spec.NodeName, p.Annotations))
			}
			mu.Unlock()
		}
	}()

	e.startScheduler()
	// 2g.10gb: three instances per A100-40GB; 12 pods fill the four GPUs. (2g.10gb rather
	// than 1g.5gb, whose seven instances per GPU would exhaust the nodes' nvidia.com/gpu
	// count, 7 per GPU, so that NodeResourcesFit would refuse the extra pod before
	// DynamicMIG says anything.)
	names := e.burst("burst", burst, 8000)
	e.waitRealised(90*time.Second, names...)
	if bound := checkPlacements(t, e.pods()); bound != burst {
		t.Errorf("bound pods: %d, want %d", bound, burst)
	}

	e.create(e.gpuPod("no-room", api.ModeMIG, [2]int{1, 8000}))
	msg := e.waitPending("no-room")
	if !hasDynamicMIGReason(msg) {
		t.Errorf("no-room is Pending with %q, which names no DynamicMIG reason", msg)
	}
	if !strings.Contains(msg, string(placement.ReasonPlacementsTaken)) && !strings.Contains(msg, string(placement.ReasonInstanceLimit)) {
		t.Errorf("no-room on four full A100s: %q, want %q or %q", msg, placement.ReasonPlacementsTaken, placement.ReasonInstanceLimit)
	}
	// The scheduler also says it in a FailedScheduling event.
	e.waitFor(30*time.Second, "a FailedScheduling event for no-room", func() (bool, string) {
		evs, err := e.admin.EventsV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Regarding.Name == "no-room" {
				seen = append(seen, ev.Reason+": "+ev.Note)
				if ev.Reason == "FailedScheduling" && hasDynamicMIGReason(ev.Note) {
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("events of no-room: %q", seen)
	})

	w.Stop()
	<-watched
	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Errorf("pod observed bound without %s: %s", api.MigReservationsAnnotation, v)
	}
	if len(seenBound) != burst {
		t.Errorf("the watch saw %d pods bound, want %d", len(seenBound), burst)
	}
}

// 40 MIG pods at once on 4 nodes × 2 A100-40GB. Each asks for one 8000 MiB device, which
// is a 2g.10gb instance; an A100-40GB holds at most three (placements [0,2) [2,4) [4,6):
// the profile's instance count), so the cluster holds 4 × 2 × 3 = 24 of them whatever the
// order of binds. Exactly 24 are bound, each with its reservation, none overlapping; the
// other 16 stay Pending with a DynamicMIG reason.
func TestConcurrentBinds(t *testing.T) {
	e := newEnv(t, "concurrent")
	for i := range 4 {
		e.addNode(fmt.Sprintf("concurrent-%d", i), a100, a100)
	}
	e.startScheduler()
	const total, capacity = 40, 24
	pods := make([]*v1.Pod, total)
	for i := range pods {
		pods[i] = e.gpuPod(fmt.Sprintf("burst-%02d", i), api.ModeMIG, [2]int{1, 8000})
	}
	var wg sync.WaitGroup
	errs := make(chan error, total)
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.admin.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
				errs <- fmt.Errorf("creating %s: %w", p.Name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	e.waitFor(120*time.Second, fmt.Sprintf("%d pods realised and %d marked unschedulable", capacity, total-capacity), func() (bool, string) {
		realised, pending := 0, 0
		for _, p := range e.pods() {
			switch {
			case p.Spec.NodeName != "" && p.Annotations[api.BindPhaseAnnotation] == api.BindPhaseSuccess:
				realised++
			case p.Spec.NodeName == "" && scheduledMessage(&p) != "":
				pending++
			}
		}
		return realised+pending == total && realised >= capacity, fmt.Sprintf("%d realised, %d unschedulable", realised, pending)
	})
	all := e.pods()
	if bound := checkPlacements(t, all); bound != capacity {
		t.Errorf("bound pods: %d, want %d (3 × 2g.10gb per A100-40GB × 8 GPUs)", bound, capacity)
	}
	perGPU := map[string]int{}
	for i := range all {
		p := &all[i]
		if p.Spec.NodeName == "" {
			if msg := scheduledMessage(p); !hasDynamicMIGReason(msg) {
				t.Errorf("%s is Pending with %q, which names no DynamicMIG reason", p.Name, msg)
			}
			continue
		}
		recs, _ := reservations(t, p)
		for _, r := range recs {
			if r.Profile != "2g.10gb" {
				t.Errorf("%s got %s, want 2g.10gb", p.Name, r.Profile)
			}
			perGPU[p.Spec.NodeName+"/"+r.GPUUUID]++
		}
	}
	if len(perGPU) != 8 {
		t.Errorf("GPUs used: %d, want all 8: %v", len(perGPU), perGPU)
	}
	for g, n := range perGPU {
		if n != 3 {
			t.Errorf("GPU %s holds %d 2g.10gb instances, want 3", g, n)
		}
	}
}

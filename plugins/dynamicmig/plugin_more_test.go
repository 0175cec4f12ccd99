package dynamicmig

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	clienttesting "k8s.io/client-go/testing"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// withAllowlist writes a device config allowing profiles on A100-40GB and returns args
// that use it.
func withAllowlist(t *testing.T, profiles string) *config.DynamicMIGArgs {
	path := filepath.Join(t.TempDir(), "device-config.yaml")
	doc := "nvidia:\n  migProfileAllowlist:\n  - models: [A100-40GB]\n    profiles: [" + profiles + "]\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return &config.DynamicMIGArgs{DeviceConfigFile: path}
}

// restrictInventory keeps only the named profiles in a node's inventory, as a device plugin
// with that allowlist would publish.
func restrictInventory(t *testing.T, n *v1.Node, keep ...string) *v1.Node {
	gpus, err := api.DecodeInventory(n.Annotations[api.NodeInventoryAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	for i := range gpus {
		gpus[i].MigProfiles = slices.DeleteFunc(gpus[i].MigProfiles, func(p api.MigProfile) bool { return !slices.Contains(keep, p.Name) })
	}
	raw, _ := api.EncodeInventory(gpus)
	n.Annotations[api.NodeInventoryAnnotation] = raw
	return n
}

func TestFragmentationCase(t *testing.T) {
	node := restrictInventory(t, gpuNode(t, "n", api.ModeMIG, "A100-40GB"), "1g.5gb", "2g.10gb", "3g.20gb")
	e := newEnv(t, withAllowlist(t, "1g.5gb, 2g.10gb, 3g.20gb"), []*v1.Node{node})
	var got []string
	for i, mem := range []int{4000, 4000, 9000, 19000} {
		got = append(got, placements(e.mustSchedule(gpuPod("p"+string(rune('0'+i)), api.ModeMIG, [2]int{1, mem})))...)
	}
	t.Logf("placed %v", got)
	if len(got) != 4 {
		t.Errorf("all four must fit: %v", got)
	}
}

func TestInvalidRequests(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	memOnly := gpuPod("mem-only", api.ModeMIG, [2]int{1, 1000})
	delete(memOnly.Spec.Containers[0].Resources.Limits, api.ResourceCount)
	badMode := gpuPod("bad-mode", "vgpu", [2]int{1, 1000})
	tooBig := gpuPod("too-big", api.ModeMIG, [2]int{1, 500000})
	fractional := gpuPod("fractional", api.ModeMIG, [2]int{1, 1000})
	fractional.Spec.Containers[0].Resources.Limits[api.ResourceCores] = resource.MustParse("0.5")
	for _, tc := range []struct {
		pod  *v1.Pod
		want string
	}{
		{memOnly, `container "c0" asks for nvidia.com/gpumem without nvidia.com/gpu`},
		{badMode, `nvidia.com/vgpu-mode is "vgpu"`},
		{tooBig, `container "c0" asks for nvidia.com/gpumem 500000`},
		{fractional, `container "c0": nvidia.com/gpucores is 500m`},
	} {
		_, statuses := e.schedule(tc.pod)
		st := statuses[""]
		if st == nil || st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.pod.Name, st, tc.want)
		}
	}
}

// TestInitContainers: a plain init container (no restartPolicy: Always) asking for a GPU makes
// PreFilter refuse the pod, unresolvably, saying what to do, and the plugin records no event
// of its own (the framework's FailedScheduling carries the message); a sidecar's GPU request
// is reserved like an app container's, under its index; a plain init container without GPU
// only counts in the indexes.
func TestInitContainers(t *testing.T) {
	withInit := func(name string, restart *v1.ContainerRestartPolicy, gpu bool) *v1.Pod {
		p := gpuPod(name, api.ModeMIG, [2]int{1, 4000})
		init := v1.Container{Name: "setup", Image: "busybox", RestartPolicy: restart}
		if gpu {
			init.Resources = p.Spec.Containers[0].Resources
		}
		p.Spec.InitContainers = []v1.Container{init}
		return p
	}
	always := v1.ContainerRestartPolicyAlways
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		// containers: the container index of each reservation; nil: refused with want.
		containers []int
		want       string
	}{
		{name: "plain init container asking for a GPU", pod: withInit("plain-init", nil, true),
			want: `init container "setup" requests nvidia.com/gpu and nvidia.com/gpumem: dynamig gives GPUs to regular containers and sidecars (init containers with restartPolicy: Always) only; move the GPU request to a sidecar or the main container`},
		{name: "sidecar asking for a GPU", pod: withInit("sidecar", &always, true), containers: []int{0, 1}},
		{name: "plain init container without GPU", pod: withInit("init-no-gpu", nil, false), containers: []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
			bound, statuses := e.schedule(tc.pod)
			if tc.containers == nil {
				st := statuses[""]
				if bound != nil || st == nil || st.Code() != fwk.UnschedulableAndUnresolvable || st.Message() != tc.want {
					t.Fatalf("bound %v, PreFilter status %v; want UnschedulableAndUnresolvable %q", bound != nil, st, tc.want)
				}
				if n := len(e.events.Events); n != 0 {
					t.Errorf("the plugin recorded %d events for a refused pod: %s", n, <-e.events.Events)
				}
				return
			}
			if bound == nil {
				t.Fatalf("unschedulable: %s", reasons(statuses))
			}
			recs, err := api.DecodeMigReservations(bound.Annotations[api.MigReservationsAnnotation])
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, r := range recs {
				got = append(got, r.ContainerIndex)
			}
			if !slices.Equal(got, tc.containers) {
				t.Errorf("reservations for containers %v, want %v", got, tc.containers)
			}
		})
	}
}

func TestPreemptionDryRun(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	e.mustSchedule(gpuPod("victim", api.ModeMIG, [2]int{1, 40000}))
	preemptor := gpuPod("preemptor", api.ModeMIG, [2]int{1, 19000})
	state, node, statuses := e.cycle(preemptor)
	if node != "" || statuses["n"].Code() != fwk.Unschedulable {
		t.Fatalf("the full GPU must refuse, resolvably: %v", statuses)
	}
	// Preemption filters a copy of the node without the victim: it must fit there.
	ni, _ := e.snapshot.NodeInfos().Get("n")
	dry := ni.Snapshot()
	victim := e.pod("victim")
	if err := dry.RemovePod(klog.Background(), victim); err != nil {
		t.Fatal(err)
	}
	if st := e.fw.RunFilterPlugins(e.ctx, state, preemptor, dry); !st.IsSuccess() {
		t.Errorf("without the victim the preemptor must fit: %v", st)
	}
	if st := e.fw.RunFilterPlugins(e.ctx, state, preemptor, ni); st.IsSuccess() {
		t.Errorf("the real node must still refuse")
	}
}

func TestSchedulerRestartSeesReservations(t *testing.T) {
	node := gpuNode(t, "n", api.ModeMIG, "A100-40GB")
	first := newEnv(t, nil, []*v1.Node{node})
	before := first.mustSchedule(gpuPod("a", api.ModeMIG, [2]int{2, 9000}))
	// A new scheduler process: same cluster objects, a fresh plugin with an empty cache.
	var objs []runtimeObject
	for _, p := range first.pods() {
		objs = append(objs, p)
	}
	second := newEnv(t, nil, []*v1.Node{node}, objs...)
	after := second.mustSchedule(gpuPod("b", api.ModeMIG, [2]int{2, 4000}))
	if len(after) != 2 {
		t.Fatalf("b: %v", after)
	}
	for _, a := range before {
		for _, b := range after {
			if a.GPUUUID == b.GPUUUID && a.Placement.Overlaps(b.Placement) {
				t.Errorf("double booking after restart: %v and %v", a, b)
			}
		}
	}
}

func TestUnreserveRollsBack(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	a := gpuPod("a", api.ModeMIG, [2]int{1, 40000})
	state, node, _ := e.cycle(a)
	if node != "n" {
		t.Fatal("a does not fit")
	}
	assumed := a.DeepCopy()
	assumed.Spec.NodeName = node
	// While a is reserved, the GPU is full for b.
	if _, node, _ := e.cycle(gpuPod("b", api.ModeMIG, [2]int{1, 4000}), assumed); node != "" {
		t.Fatalf("b fit beside a's reservation")
	}
	e.fw.RunReservePluginsUnreserve(e.ctx, state, a, "n")
	if e.pl.reservations.inflightCount() != 0 {
		t.Fatalf("Unreserve left the reservation")
	}
	if _, node, _ := e.cycle(gpuPod("b", api.ModeMIG, [2]int{1, 4000})); node != "n" {
		t.Errorf("after Unreserve b must fit")
	}
}

func TestConcurrentBindsNeverOverlap(t *testing.T) {
	var nodes []*v1.Node
	for _, name := range []string{"n1", "n2", "n3"} {
		nodes = append(nodes, gpuNode(t, name, api.ModeMIG, "A100-40GB", "A100-40GB"))
	}
	e := newEnv(t, nil, nodes)
	var assumed []*v1.Pod
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	const pods = 24 // twelve 1g.5gb and twelve 2g.10gb: they fit the six GPUs exactly
	for i := 0; i < pods; i++ {
		pod := gpuPod("p"+strings.Repeat("x", i), api.ModeMIG, [2]int{1, 4000 + 5000*(i%2)})
		if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		state, node, statuses := e.cycle(pod, assumed...)
		if node == "" {
			t.Logf("pod %d unschedulable: %s", i, reasons(statuses))
			continue
		}
		a := pod.DeepCopy()
		a.Spec.NodeName = node
		assumed = append(assumed, a)
		wg.Add(1)
		go func() { // binding cycles run concurrently, as in the scheduler
			defer wg.Done()
			if st := e.fw.RunBindPlugins(e.ctx, state, pod, node); !st.IsSuccess() {
				errs <- st.AsError()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	seen := map[string][]api.Placement{}
	bound := 0
	for _, p := range e.pods() {
		if p.Spec.NodeName == "" {
			continue
		}
		bound++
		recs, err := api.DecodeMigReservations(p.Annotations[api.MigReservationsAnnotation])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			for _, o := range seen[r.GPUUUID] {
				if o.Overlaps(r.Placement) {
					t.Errorf("overlap on %s: %v and %v", r.GPUUUID, o, r.Placement)
				}
			}
			seen[r.GPUUUID] = append(seen[r.GPUUUID], r.Placement)
		}
	}
	if bound != len(assumed) || bound != pods {
		t.Errorf("bound %d of %d reserved", bound, len(assumed))
	}
}

func TestModesAndSelectors(t *testing.T) {
	mig := gpuNode(t, "mig-node", api.ModeMIG, "A100-40GB")
	core := gpuNode(t, "core-node", api.ModeHAMiCore, "A100-40GB")
	e := newEnv(t, nil, []*v1.Node{mig, core})
	if p, _ := e.schedule(gpuPod("m", api.ModeMIG, [2]int{1, 4000})); p == nil || p.Spec.NodeName != "mig-node" {
		t.Errorf("mig pod: %v", p)
	}
	p, _ := e.schedule(gpuPod("h", api.ModeHAMiCore, [2]int{1, 4000}))
	if p == nil || p.Spec.NodeName != "core-node" {
		t.Fatalf("hami-core pod: %v", p)
	}
	devs, err := api.DecodeHAMiCoreDevices(api.DevicesAllocatedAnnotation, p.Annotations[api.DevicesAllocatedAnnotation])
	if err != nil || len(devs) != 1 || len(devs[0]) != 1 || devs[0][0].MemoryMiB != 4000 || p.Annotations[api.DevicesToAllocateAnnotation] == "" {
		t.Errorf("hami-core annotations: %v %v", p.Annotations, err)
	}
	sel := gpuPod("sel", "", [2]int{1, 4000})
	sel.Annotations[api.NoUseGPUTypeAnnotation] = "a100"
	if p, statuses := e.schedule(sel); p != nil || !strings.Contains(reasons(statuses), string(placement.ReasonNotSelected)) {
		t.Errorf("nouse-gputype a100 must leave no GPU: %v %s", p, reasons(statuses))
	}
	// hami-core share limits: 10 shares of 40 GiB; a 40000 MiB share leaves no memory.
	if p, _ := e.schedule(gpuPod("big", api.ModeHAMiCore, [2]int{1, 36000})); p == nil {
		t.Fatal("big share")
	}
	if p, statuses := e.schedule(gpuPod("over", api.ModeHAMiCore, [2]int{1, 4000})); p != nil || !strings.Contains(reasons(statuses), string(placement.ReasonShareLimit)) {
		t.Errorf("memory is exhausted: %v %s", p, reasons(statuses))
	}
}

func TestHeartbeat(t *testing.T) {
	node := gpuNode(t, "n", api.ModeMIG, "A100-40GB")
	e := newEnv(t, nil, []*v1.Node{node})
	stale := heartbeat("n", time.Now().Add(-time.Hour))
	if _, err := e.client.CoordinationV1().Leases(api.DefaultSystemNamespace).Update(e.ctx, stale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !e.pl.leaseTimes.heartbeatFresh("n", time.Now()) })
	pod := gpuPod("p", api.ModeMIG, [2]int{1, 4000})
	if p, statuses := e.schedule(pod); p != nil || !strings.Contains(reasons(statuses), reasonHeartbeat) {
		t.Fatalf("a node without heartbeat must refuse: %s", reasons(statuses))
	}
	// Preemption's dry runs filter on clones of the cycle state: they judge the heartbeat at
	// the cycle's start too, never at the zero time (where every heartbeat ever seen is fresh).
	state, _, _ := e.cycle(e.pod("p"))
	infos, _ := e.snapshot.NodeInfos().List()
	if st := e.pl.Filter(e.ctx, state.Clone(), e.pod("p"), infos[0]); st.IsSuccess() || !strings.Contains(st.Message(), reasonHeartbeat) {
		t.Fatalf("a clone of the cycle state must refuse the node without heartbeat: %v", st)
	}
	activated := e.activator.waitFor(t, "default/p", func() {
		if _, err := e.client.CoordinationV1().Leases(api.DefaultSystemNamespace).Update(e.ctx, heartbeat("n", time.Now()), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	if !activated {
		t.Errorf("a renewed heartbeat must activate the refused pod")
	}
	if _, node, _ := e.cycle(e.pod("p")); node != "n" {
		t.Errorf("after the heartbeat the pod fits")
	}
}

// TestHeartbeatWaitersForgetDeletedPods: pods refused for a node's expired heartbeat wait
// for it to come back; one deleted meanwhile is forgotten, so a node hung for days does not
// collect every pod that ever asked for it.
func TestHeartbeatWaitersForgetDeletedPods(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	if _, err := e.client.CoordinationV1().Leases(api.DefaultSystemNamespace).Update(e.ctx, heartbeat("n", time.Now().Add(-time.Hour)), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !e.pl.leaseTimes.heartbeatFresh("n", time.Now()) })
	pod := gpuPod("p", api.ModeMIG, [2]int{1, 4000})
	if p, _ := e.schedule(pod); p != nil {
		t.Fatal("a node without heartbeat must refuse")
	}
	if _, waiting := e.pl.heartbeatWaiters.Load(pod.UID); !waiting {
		t.Fatal("the refused pod waits for the heartbeat")
	}
	if err := e.client.CoreV1().Pods(pod.Namespace).Delete(e.ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, waiting := e.pl.heartbeatWaiters.Load(pod.UID); return !waiting })
}

// TestEvictsPodsTheDevicePluginGaveUp: a node's device plugin marks a pod whose reservation
// can never be realised there (bind-phase failed, dynamig.io/bind-failure); the scheduler
// evicts it, by UID, and nothing else: not a pod merely failed by its bind phase, nor one
// already going away.
func TestEvictsPodsTheDevicePluginGaveUp(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	bound := func(name string, annotations map[string]string) *v1.Pod {
		p := gpuPod(name, api.ModeMIG, [2]int{1, 4000})
		p.Spec.NodeName = "n"
		maps.Copy(p.Annotations, annotations)
		if _, err := e.client.CoreV1().Pods(p.Namespace).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	given := bound("given-up", map[string]string{api.BindPhaseAnnotation: api.BindPhaseFailed, api.BindFailureAnnotation: "placement [0,2) overlaps the instance of running pod default/x"})
	bound("failed-bind-only", map[string]string{api.BindPhaseAnnotation: api.BindPhaseFailed})
	bound("running", map[string]string{api.BindPhaseAnnotation: api.BindPhaseSuccess})
	evicted := func() []string {
		var names []string
		for _, a := range e.client.Actions() {
			if c, ok := a.(clienttesting.CreateAction); ok && a.GetSubresource() == "eviction" {
				ev := c.GetObject().(*policyv1.Eviction)
				if ev.DeleteOptions == nil || ev.DeleteOptions.Preconditions == nil || *ev.DeleteOptions.Preconditions.UID != given.UID {
					t.Errorf("an eviction without the pod's UID as precondition: %+v", ev.DeleteOptions)
				}
				names = append(names, ev.Name)
			}
		}
		return names
	}
	waitFor(t, func() bool { return len(evicted()) > 0 })
	time.Sleep(100 * time.Millisecond)
	if got := evicted(); !slices.Equal(got, []string{"given-up"}) {
		t.Errorf("evicted %v, want only given-up", got)
	}
}

func TestSignPodAndSkips(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	cpu := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: "default", UID: "cpu-uid"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox"}}}}
	if _, st := e.pl.SignPod(e.ctx, cpu); !st.IsSuccess() {
		t.Errorf("CPU pods keep batching: %v", st)
	}
	if frags, st := e.pl.SignPod(e.ctx, cpu); !st.IsSuccess() || len(frags) != 1 || frags[0].Key != nodePolicySignKey || frags[0].Value != api.PolicyBinpack {
		t.Errorf("CPU pods sign their node policy only (Score ranks their nodes' CPU and memory by it): %v %v", frags, st)
	}
	state := framework.NewCycleState()
	e.snapshot.set(cache.NewSnapshot(nil, e.nodes))
	if _, st, _ := e.fw.RunPreFilterPlugins(e.ctx, state, cpu); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := e.pl.Bind(e.ctx, state, cpu, "n"); st.Code() != fwk.Skip {
		t.Errorf("Bind must skip CPU pods for DefaultBinder: %v", st)
	}
	// A whole cycle for a CPU pod: Filter skipped, Score by CPU and memory, DefaultBinder
	// binds it.
	if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, cpu, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.nodes = append(e.nodes, gpuNode(t, "n2", api.ModeMIG, "A30"))
	cycleState, node, statuses := e.cycle(cpu)
	if node == "" {
		t.Fatalf("CPU pod: %s", reasons(statuses))
	}
	if st := e.fw.RunBindPlugins(e.ctx, cycleState, cpu, node); !st.IsSuccess() {
		t.Fatalf("CPU pod bind: %v", st)
	}
	if e.pod("cpu").Spec.NodeName != node || e.pl.reservations.inflightCount() != 0 {
		t.Errorf("CPU pod not bound by DefaultBinder")
	}
}

// TestSignGPUPods: a GPU pod's signature is its request's shape and node policy: pods that
// differ only in what DynamicMIG does not read (names, UIDs, container names) sign alike, any
// difference in the request or the policy signs differently, and an invalid request is not
// signed.
func TestSignGPUPods(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	sign := func(p *v1.Pod) string {
		t.Helper()
		frags, st := e.pl.SignPod(e.ctx, p)
		if !st.IsSuccess() || len(frags) != 1 || frags[0].Key != gpuRequestSignKey {
			t.Fatalf("pod %s: %v %v", p.Name, frags, st)
		}
		raw, err := json.Marshal(frags[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	base := sign(gpuPod("a", api.ModeMIG, [2]int{1, 8000}))
	renamed := gpuPod("b", api.ModeMIG, [2]int{1, 8000})
	renamed.Spec.Containers[0].Name = "other"
	if got := sign(renamed); got != base {
		t.Errorf("identical requests sign differently:\n%s\n%s", base, got)
	}
	spread := gpuPod("s", api.ModeMIG, [2]int{1, 8000})
	spread.Annotations[api.NodeSchedulerPolicyAnnotation] = "spread"
	useA30 := gpuPod("u", api.ModeMIG, [2]int{1, 8000})
	useA30.Annotations[api.UseGPUTypeAnnotation] = "A30"
	for name, p := range map[string]*v1.Pod{
		"more memory":    gpuPod("m", api.ModeMIG, [2]int{1, 9000}),
		"two devices":    gpuPod("d", api.ModeMIG, [2]int{2, 8000}),
		"two containers": gpuPod("c", api.ModeMIG, [2]int{1, 8000}, [2]int{1, 8000}),
		"hami-core":      gpuPod("h", api.ModeHAMiCore, [2]int{1, 8000}),
		"spread":         spread,
		"a GPU type":     useA30,
	} {
		if got := sign(p); got == base {
			t.Errorf("%s signs as the base request: %s", name, got)
		}
	}
	bad := gpuPod("bad", api.ModeMIG, [2]int{1, 8000})
	bad.Annotations[api.NodeSchedulerPolicyAnnotation] = "sideways"
	if _, st := e.pl.SignPod(e.ctx, bad); st.Code() != fwk.Unschedulable {
		t.Errorf("an invalid request: %v, want Unschedulable (not signable)", st)
	}
}

// TestRefusalCountedOncePerCycle: a node that refuses a pod is counted once in its cycle
// however often it is filtered (kube-scheduler's batching probes the previous pod's node
// before the pod's own Filter calls; preemption's dry runs filter clones of the state).
func TestRefusalCountedOncePerCycle(t *testing.T) {
	// The pod fits an A100-40GB (PreFilter lets it through), never an A30.
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A30"), gpuNode(t, "a100", api.ModeMIG, "A100-40GB")})
	e.snapshot.set(cache.NewSnapshot(nil, e.nodes))
	pod := gpuPod("big", api.ModeMIG, [2]int{1, 30000})
	counter := refusals.WithLabelValues(string(placement.ReasonNoProfile))
	before := testutil.ToFloat64(counter)
	state := framework.NewCycleState()
	if _, st, _ := e.fw.RunPreFilterPlugins(e.ctx, state, pod); !st.IsSuccess() {
		t.Fatal(st)
	}
	ni, err := e.snapshot.NodeInfos().Get("n")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []fwk.CycleState{state, state, state.Clone()} {
		if st := e.fw.RunFilterPlugins(e.ctx, s, pod, ni); st.IsSuccess() {
			t.Fatal("a 30000 MiB device fits on an A30")
		}
	}
	if got := testutil.ToFloat64(counter) - before; got != 1 {
		t.Errorf("refusals counted %v times in one cycle, want 1", got)
	}
	// The next cycle counts again.
	next := framework.NewCycleState()
	if _, st, _ := e.fw.RunPreFilterPlugins(e.ctx, next, pod); !st.IsSuccess() {
		t.Fatal(st)
	}
	e.fw.RunFilterPlugins(e.ctx, next, pod, ni)
	if got := testutil.ToFloat64(counter) - before; got != 2 {
		t.Errorf("refusals after a second cycle: %v, want 2", got)
	}
}

func TestNodeQueueingHint(t *testing.T) {
	e := newEnv(t, nil, nil)
	n := gpuNode(t, "n", api.ModeMIG, "A100-40GB")
	plain := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}}
	changed := n.DeepCopy()
	changed.Annotations[api.NodeInventoryAnnotation] = restrictInventory(t, n.DeepCopy(), "1g.5gb").Annotations[api.NodeInventoryAnnotation]
	relabelled := n.DeepCopy()
	relabelled.Labels = map[string]string{"x": "y"}
	// A device plugin restarting: the kubelet advertises none of its devices, then all again.
	noDevices := n.DeepCopy()
	noDevices.Status.Allocatable[api.ResourceCount] = resource.MustParse("0")
	plainMore := plain.DeepCopy()
	plainMore.Status.Allocatable = v1.ResourceList{api.ResourceCount: resource.MustParse("8")}
	for _, tc := range []struct {
		name     string
		old, new *v1.Node
		want     fwk.QueueingHint
	}{
		{"GPU node added", nil, n, fwk.Queue},
		{"CPU node added", nil, plain, fwk.QueueSkip},
		{"inventory changed", n, changed, fwk.Queue},
		{"other change", n, relabelled, fwk.QueueSkip},
		{"devices gone", n, noDevices, fwk.QueueSkip},
		{"devices back", noDevices, n, fwk.Queue},
		{"devices on a node without an inventory", plain, plainMore, fwk.QueueSkip},
	} {
		var old any
		if tc.old != nil {
			old = tc.old
		}
		if got, _ := e.pl.isSchedulableAfterNodeChange(klog.Background(), gpuPod("p", "", [2]int{1, 1}), old, tc.new); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	cpuPod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default"}, Spec: v1.PodSpec{NodeName: "n"}}
	if got, _ := e.pl.isSchedulableAfterPodDelete(klog.Background(), gpuPod("p", "", [2]int{1, 1}), cpuPod, nil); got != fwk.QueueSkip {
		t.Errorf("a CPU pod's deletion frees no GPU")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStateMetrics(t *testing.T) {
	e := newEnv(t, &config.DynamicMIGArgs{LegacyMetrics: true}, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	e.mustSchedule(gpuPod("a", api.ModeMIG, [2]int{2, 8000}))
	// The device plugin realises the first device.
	p := e.pod("a")
	recs, _ := api.DecodeMigReservations(p.Annotations[api.MigReservationsAnnotation])
	recs[0].SetRuntime("MIG-abc", 3, 0)
	e.realise(p, recs)
	var out string
	waitFor(t, func() bool {
		out = scrape(t)
		return strings.Contains(out, `mig_uuid="MIG-abc"`)
	})
	for _, want := range []string{
		`hami_node_gpu_mig_instance_info{compute_instance_id="0",device_index="0",device_uuid="` + recs[0].GPUUUID + `",gpu_instance_id="3",mig_uuid="MIG-abc",node="n",placement_size="2",placement_start="0",profile="2g.10gb",zone="vGPU"} 1`,
		`nodeGPUMigInstance{deviceidx="0",deviceuuid="` + recs[0].GPUUUID + `",migname="2g.10gb-3",nodeid="n",zone="vGPU"} 1`,
		`dynamig_scheduler_gpu_allocated{device_index="0",device_uuid="` + recs[0].GPUUUID + `",mode="mig",node="n",resource="slots"} 4`,
		`dynamig_scheduler_gpu_allocated{device_index="0",device_uuid="` + recs[0].GPUUUID + `",mode="mig",node="n",resource="memory_mib"} 19712`,
		`dynamig_scheduler_gpu_capacity{device_index="0",device_uuid="` + recs[0].GPUUUID + `",mode="mig",node="n",resource="slots"} 8`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Count(out, "hami_node_gpu_mig_instance_info{") != 1 {
		t.Errorf("only realised reservations are instances:\n%s", out)
	}
}

func scrape(t *testing.T) string {
	t.Helper()
	families, err := Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// TestNominatedPodsTakeRoom: kube-scheduler filters a lower-priority pod on a NodeInfo to
// which it added the pods nominated there (addGENominatedPods); such a pod holds no
// reservation yet, but the room its preemption freed is its own. Otherwise the low-priority
// pod takes it and the preemptor preempts again (issue 14, defect 1).
func TestNominatedPodsTakeRoom(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	preemptor := gpuPod("preemptor", api.ModeMIG, [2]int{1, 40000})
	priority := int32(1000)
	preemptor.Spec.Priority = &priority
	preemptor.Status.NominatedNodeName = "n"
	sneak := gpuPod("sneak", api.ModeMIG, [2]int{1, 4000})
	e.snapshot.set(cache.NewSnapshot(nil, e.nodes))
	state := framework.NewCycleState()
	if _, st, _ := e.fw.RunPreFilterPlugins(e.ctx, state, sneak); !st.IsSuccess() {
		t.Fatal(st)
	}
	ni, _ := e.snapshot.NodeInfos().Get("n")
	if st := e.fw.RunFilterPlugins(e.ctx, state, sneak, ni); !st.IsSuccess() {
		t.Fatalf("the empty node must take the pod: %v", st)
	}
	// As addGENominatedPods does it.
	withNominated := ni.Snapshot()
	pi, err := framework.NewPodInfo(preemptor)
	if err != nil {
		t.Fatal(err)
	}
	withNominated.AddPodInfo(pi)
	st := e.fw.RunFilterPlugins(e.ctx, state, sneak, withNominated)
	if st.IsSuccess() || !strings.Contains(st.Message(), string(placement.ReasonPlacementsTaken)) {
		t.Errorf("with the preemptor nominated for the whole GPU, the pod must not fit: %v", st)
	}
}

// TestBinpackFirstFitByName: binpack fills nodes in name order whatever order the
// scheduler lists them in: whole GPUs go to "a" until it is full, then to "b", although
// "c" comes first and a full node is no longer the fuller choice once "b" is in use.
func TestBinpackFirstFitByName(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{
		gpuNode(t, "c", api.ModeMIG, "A100-40GB", "A100-40GB"),
		gpuNode(t, "a", api.ModeMIG, "A100-40GB", "A100-40GB"),
		gpuNode(t, "b", api.ModeMIG, "A100-40GB", "A100-40GB"),
	})
	for i, want := range []string{"a", "a", "b", "b", "c"} {
		bound, statuses := e.schedule(gpuPod(fmt.Sprintf("p%d", i), api.ModeMIG, [2]int{1, 0}))
		if bound == nil {
			t.Fatalf("p%d unschedulable: %s", i, reasons(statuses))
		}
		if bound.Spec.NodeName != want {
			t.Errorf("p%d on %s, want %s", i, bound.Spec.NodeName, want)
		}
	}
}

// TestMaxNodeScore: NormalizeScore ranks onto placement.MaxNodeScore, which must be the
// range kube-scheduler accepts.
func TestMaxNodeScore(t *testing.T) {
	if placement.MaxNodeScore != fwk.MaxNodeScore {
		t.Errorf("placement.MaxNodeScore %d, kube-scheduler's %d", placement.MaxNodeScore, fwk.MaxNodeScore)
	}
}

// TestSignPodConcurrently: from 1.36 kube-scheduler signs a pod once when it is queued, on the
// queue's goroutines, while cycles run (`make race` runs this on the newest minor): SignPod
// reads only the pod and the args, and says the same for every call.
func TestSignPodConcurrently(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	e.snapshot.set(cache.NewSnapshot(nil, e.nodes))
	gpu := gpuPod("g", api.ModeMIG, [2]int{1, 8000})
	cpu := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: "default", UID: "cpu-uid"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox"}}}}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if frags, st := e.pl.SignPod(e.ctx, gpu); !st.IsSuccess() || len(frags) != 1 {
					t.Errorf("goroutine %d: GPU pod: %v %v", i, frags, st)
					return
				}
				if frags, st := e.pl.SignPod(e.ctx, cpu); !st.IsSuccess() || len(frags) != 1 || frags[0].Value != api.PolicyBinpack {
					t.Errorf("goroutine %d: CPU pod: %v %v", i, frags, st)
					return
				}
			}
		}()
	}
	// A cycle for the GPU pod runs meanwhile.
	if _, node, statuses := e.cycle(gpu); node != "n" {
		t.Errorf("GPU pod: %s", reasons(statuses))
	}
	wg.Wait()
}

// groupCycleState is a pod-group cycle's CycleState (podGroupCycle): kube-scheduler 1.36 and
// later mark one so; the method is promoted where CycleState has it, and added on 1.35.
type groupCycleState struct{ fwk.CycleState }

func (groupCycleState) IsPodGroupSchedulingCycle() bool { return true }

// TestPodGroupCycle runs DynamicMIG as kube-scheduler's pod-group cycle does (1.36 and
// later, schedule_one_podgroup.go): each pod of the group filtered and reserved in turn, then
// assumed into the snapshot's NodeInfo with its generation kept (Snapshot.AssumePod), the
// group reverted in reverse order (Unreserve, Snapshot.ForgetPod), and, where it fits whole,
// each pod reserved again from its cycle's fit before any binds. On one A100-40GB (room for
// two 3g.20gb): the second pod gets the other placement, not the first pod's; a third finds
// no room; a group that failed leaves no reservation and the next pod the best placement;
// while a group's reservations are held, a single pod finds no room.
func TestPodGroupCycle(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	e.snapshot.set(cache.NewSnapshot(nil, e.nodes))
	info, _ := e.snapshot.NodeInfos().Get("n")
	ni := info.(*framework.NodeInfo)
	logger := klog.FromContext(e.ctx)

	type member struct {
		pod   *v1.Pod
		state fwk.CycleState
	}
	// simulate tries pods as the group cycle does, and returns those that fit, assumed.
	simulate := func(pods ...*v1.Pod) (fit []member, refused *fwk.Status) {
		for _, p := range pods {
			state := groupCycleState{framework.NewCycleState()}
			if _, st, _ := e.fw.RunPreFilterPlugins(e.ctx, state, p); !st.IsSuccess() {
				t.Fatalf("%s: prefilter: %v", p.Name, st)
			}
			if st := e.fw.RunFilterPlugins(e.ctx, state, p, ni); !st.IsSuccess() {
				return fit, st
			}
			if st := e.fw.RunReservePluginsReserve(e.ctx, state, p, "n"); !st.IsSuccess() {
				t.Fatalf("%s: reserve: %v", p.Name, st)
			}
			assumed := p.DeepCopy()
			assumed.Spec.NodeName = "n"
			generation := ni.Generation
			ni.AddPod(assumed)
			ni.Generation = generation
			fit = append(fit, member{assumed, state})
		}
		return fit, nil
	}
	revert := func(ms []member) {
		for i := len(ms) - 1; i >= 0; i-- {
			e.fw.RunReservePluginsUnreserve(e.ctx, ms[i].state, ms[i].pod, "n")
			generation := ni.Generation
			if err := ni.RemovePod(logger, ms[i].pod); err != nil {
				t.Fatal(err)
			}
			ni.Generation = generation
		}
	}
	placementOf := func(m member) string {
		s, err := readState(m.state)
		if err != nil {
			t.Fatal(err)
		}
		f, ok := s.fit("n")
		if !ok {
			t.Fatalf("%s: no fit", m.pod.Name)
		}
		return describe(f.result)
	}

	// A group of three: two fit, on different placements, the third does not.
	fit, refused := simulate(gpuPod("g1", api.ModeMIG, [2]int{1, 19000}), gpuPod("g2", api.ModeMIG, [2]int{1, 19000}), gpuPod("g3", api.ModeMIG, [2]int{1, 19000}))
	if len(fit) != 2 || refused == nil {
		t.Fatalf("%d of the group fit (refused: %v), want 2 and the third refused", len(fit), refused)
	}
	first, second := placementOf(fit[0]), placementOf(fit[1])
	if first == second {
		t.Fatalf("both members of the group got %s", first)
	}
	if n := e.pl.reservations.inflightCount(); n != 2 {
		t.Fatalf("%d reservations held during the group's cycle, want 2", n)
	}
	// The group cannot fit whole: reverted, it holds nothing, and a single pod gets the
	// placement the first member had (the group's fits were not cached).
	revert(fit)
	if n := e.pl.reservations.inflightCount(); n != 0 {
		t.Fatalf("%d reservations left after the failed group", n)
	}
	single, _ := simulate(gpuPod("single", api.ModeMIG, [2]int{1, 19000}))
	if len(single) != 1 || placementOf(single[0]) != first {
		t.Fatalf("a single pod after the failed group: %v, want %s", single, first)
	}
	revert(single)

	// A group of two fits whole: reverted, then each member reserved again from its own
	// cycle's fit, as the pods go to binding; while they are held, a single pod finds no room.
	fit, refused = simulate(gpuPod("h1", api.ModeMIG, [2]int{1, 19000}), gpuPod("h2", api.ModeMIG, [2]int{1, 19000}))
	if len(fit) != 2 || refused != nil {
		t.Fatalf("%d of the group fit (refused: %v), want both", len(fit), refused)
	}
	revert(fit)
	var assumed []*v1.Pod
	for _, m := range fit {
		// prepareForBindingCycle: the cycle is no pod-group cycle any more.
		state := m.state.(groupCycleState).CycleState
		if st := e.fw.RunReservePluginsReserve(e.ctx, state, m.pod, "n"); !st.IsSuccess() {
			t.Fatalf("%s: reserve again: %v", m.pod.Name, st)
		}
		assumed = append(assumed, m.pod)
	}
	if _, node, statuses := e.cycle(gpuPod("c", api.ModeMIG, [2]int{1, 19000}), assumed...); node != "" {
		t.Fatalf("a single pod was placed on %s beside the held group", node)
	} else if st := statuses["n"]; st == nil || !strings.Contains(st.Message(), string(placement.ReasonPlacementsTaken)) {
		t.Errorf("the single pod's refusal: %v, want %q", st, placement.ReasonPlacementsTaken)
	}
}

// Inventories are decoded as the Node informer delivers them, before any pod is scheduled
// (kube-scheduler waits for the handlers' first sync), again when the annotation changes,
// and forgotten with the annotation or the node.
func TestInventoryDecodedOnNodeEvents(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n1", api.ModeMIG, "A100-40GB"), gpuNode(t, "n2", api.ModeMIG, "A100-40GB")})
	if !toolscache.WaitForCacheSync(e.ctx.Done(), e.pl.nodesRead) {
		t.Fatal("the Node handler did not sync")
	}
	for _, name := range []string{"n1", "n2"} {
		if !e.pl.inventory.decoded(name) {
			t.Errorf("the inventory of %s is not decoded before any pod was scheduled", name)
		}
	}
	if got := e.pl.inventory.largestSeen(api.ModeMIG); got != 40192 {
		t.Errorf("largest MIG device seen %d MiB, want 40192 (the 7g.40gb of an A100-40GB)", got)
	}
	// A node whose new inventory has an H100 is decoded again as the update arrives.
	n1 := gpuNode(t, "n1", api.ModeMIG, "H100-80GB")
	if _, err := e.client.CoreV1().Nodes().Update(e.ctx, n1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return e.pl.inventory.largestSeen(api.ModeMIG) > 40192, nil
	}); err != nil {
		t.Errorf("the updated inventory of n1 was not decoded: largest MIG device seen %d MiB", e.pl.inventory.largestSeen(api.ModeMIG))
	}
	// A node that stops publishing an inventory, and a deleted node, are forgotten.
	delete(n1.Annotations, api.NodeInventoryAnnotation)
	if _, err := e.client.CoreV1().Nodes().Update(e.ctx, n1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return !e.pl.inventory.decoded("n1"), nil
	}); err != nil {
		t.Error("the inventory n1 no longer publishes is still held")
	}
	if err := e.client.CoreV1().Nodes().Delete(e.ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return !e.pl.inventory.decoded("n2"), nil
	}); err != nil {
		t.Error("the inventory of the deleted node n2 is still held")
	}
}

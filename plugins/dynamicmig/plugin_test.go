package dynamicmig

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultbinder"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/queuesort"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
	tf "k8s.io/kubernetes/pkg/scheduler/testing/framework"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/signing"
	"github.com/dynamig/dynamig/test/fixture"
)

func init() { schedmetrics.Register() }

// env is one scheduler profile (queue sort, DynamicMIG at every point, DefaultBinder after
// it) over a fake clientset whose Binding subresource writes the node and annotations into
// the stored pod, as the API server does.
type env struct {
	t      testing.TB
	ctx    context.Context
	client *fake.Clientset
	fw     framework.Framework
	pl     *DynamicMIG
	args   *config.DynamicMIGArgs
	events *events.FakeRecorder

	snapshot  *swappableSnapshot
	nodes     []*v1.Node
	activator *recordingActivator
}

// swappableSnapshot lets each test cycle see the cluster as it is now. The snapshot is embedded
// so that the listers kube-scheduler adds in later minors (1.36's pod groups) come with it on
// every minor of the matrix; these tests call only NodeInfos and StorageInfos, which set may
// race with.
type swappableSnapshot struct {
	mu sync.Mutex
	*cache.Snapshot
}

func (s *swappableSnapshot) set(snap *cache.Snapshot) { s.mu.Lock(); s.Snapshot = snap; s.mu.Unlock() }
func (s *swappableSnapshot) get() *cache.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Snapshot
}
func (s *swappableSnapshot) NodeInfos() fwk.NodeInfoLister       { return s.get().NodeInfos() }
func (s *swappableSnapshot) StorageInfos() fwk.StorageInfoLister { return s.get().StorageInfos() }

func newEnv(t testing.TB, args *config.DynamicMIGArgs, nodes []*v1.Node, objs ...runtime.Object) *env {
	t.Helper()
	return newEnvOf(t, args, nodes, nil, objs...)
}

// newEnvWithFit is newEnv with kube-scheduler's NodeResourcesFit at PreFilter and Filter
// before DynamicMIG, with the chart's args (the GPU request's memory and cores ignored).
func newEnvWithFit(t testing.TB, nodes []*v1.Node) *env {
	t.Helper()
	fit := func(ctx context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		return noderesources.NewFit(ctx, chartFitArgs(), h, feature.Features{})
	}
	return newEnvOf(t, nil, nodes, []tf.RegisterPluginFunc{tf.RegisterPluginAsExtensions(noderesources.Name, fit, "PreFilter", "Filter")})
}

// chartFitArgs are NodeResourcesFit's args in the chart's profile.
func chartFitArgs() *schedconfig.NodeResourcesFitArgs {
	return &schedconfig.NodeResourcesFitArgs{
		IgnoredResources: []string{api.ResourceMemory, api.ResourceMemoryPercentage, api.ResourceCores, api.ResourcePriority},
		ScoringStrategy: &schedconfig.ScoringStrategy{Type: schedconfig.LeastAllocated,
			Resources: []schedconfig.ResourceSpec{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}}},
	}
}

// newEnvOf builds the env with the plugins of before registered ahead of DynamicMIG.
func newEnvOf(t testing.TB, args *config.DynamicMIGArgs, nodes []*v1.Node, before []tf.RegisterPluginFunc, objs ...runtime.Object) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	if args == nil {
		args = &config.DynamicMIGArgs{}
	}
	args.SetDefaults()
	for _, n := range nodes {
		objs = append(objs, n, heartbeat(n.Name, time.Now()))
	}
	e := &env{t: t, ctx: ctx, client: fake.NewClientset(objs...), args: args, events: events.NewFakeRecorder(1000),
		snapshot: &swappableSnapshot{Snapshot: cache.NewEmptySnapshot()}, nodes: nodes, activator: &recordingActivator{}}
	e.client.PrependReactor("create", "pods", e.bindReactor)
	e.client.PrependReactor("create", "pods", evictionReactor)
	factory := informers.NewSharedInformerFactory(e.client, 0)
	var pl *DynamicMIG
	newPlugin := func(ctx context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		p, err := New(ctx, args, h, feature.Features{})
		if err == nil {
			pl = p.(*DynamicMIG)
		}
		return p, err
	}
	fw, err := tf.NewFramework(ctx, slices.Concat([]tf.RegisterPluginFunc{tf.RegisterQueueSortPlugin(queuesort.Name, queuesort.New)}, before, []tf.RegisterPluginFunc{
		tf.RegisterPluginAsExtensions(Name, newPlugin, "PreFilter", "Filter", "PreScore", "Score", "Reserve", "Bind"),
		tf.RegisterBindPlugin(defaultbinder.Name, defaultbinder.New),
	}), "dynamig-scheduler",
		frameworkruntime.WithClientSet(e.client),
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithEventRecorder(e.events),
		frameworkruntime.WithSnapshotSharedLister(e.snapshot),
		frameworkruntime.WithPodActivator(e.activator),
	)
	if err != nil {
		t.Fatal(err)
	}
	e.fw, e.pl = fw, pl
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), pl.leasesRead) {
		t.Fatal("the heartbeat Leases were not read")
	}
	return e
}

// bindReactor stores a Binding the way the API server does: node and annotations merged
// into the pod. The fake clientset's own binding stores nothing.
func (e *env) bindReactor(action clienttesting.Action) (bool, runtime.Object, error) {
	create, ok := action.(clienttesting.CreateAction)
	if !ok || action.GetSubresource() != "binding" {
		return false, nil, nil
	}
	b := create.GetObject().(*v1.Binding)
	obj, err := e.client.Tracker().Get(v1.SchemeGroupVersion.WithResource("pods"), b.Namespace, b.Name)
	if err != nil {
		return true, nil, err
	}
	pod := obj.(*v1.Pod).DeepCopy()
	if pod.Spec.NodeName != "" {
		return true, nil, fmt.Errorf("pod %s/%s is already bound to %s", pod.Namespace, pod.Name, pod.Spec.NodeName)
	}
	pod.Spec.NodeName = b.Target.Name
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	for k, v := range b.Annotations {
		pod.Annotations[k] = v
	}
	return true, b, e.client.Tracker().Update(v1.SchemeGroupVersion.WithResource("pods"), pod, pod.Namespace)
}

// evictionReactor answers an Eviction as the API server does when the pod's disruption
// budgets allow it (the fake clientset's tracker has no eviction subresource). Registered
// before the plugin starts: reactors are not to be added while its goroutines use the client.
func evictionReactor(action clienttesting.Action) (bool, runtime.Object, error) {
	if action.GetSubresource() != "eviction" {
		return false, nil, nil
	}
	return true, nil, nil
}

// evictions are the names of the pods evicted through the client so far.
func (e *env) evictions() []string {
	var names []string
	for _, a := range e.client.Actions() {
		if c, ok := a.(clienttesting.CreateAction); ok && a.GetSubresource() == "eviction" {
			names = append(names, c.GetObject().(*policyv1.Eviction).Name)
		}
	}
	return names
}

// pods lists the stored pods.
func (e *env) pods() []*v1.Pod {
	list, err := e.client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	out := make([]*v1.Pod, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out
}

func (e *env) pod(name string) *v1.Pod {
	p, err := e.client.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// cycle runs one scheduling cycle for the pod as the scheduler does, up to Reserve, on a
// snapshot of the stored bound pods plus the assumed ones. It returns the chosen node, or
// "" and the statuses of the nodes.
func (e *env) cycle(pod *v1.Pod, assumed ...*v1.Pod) (fwk.CycleState, string, map[string]*fwk.Status) {
	e.t.Helper()
	// The scheduler's cache holds each pod once: the stored pod once its Binding is seen,
	// the assumed one before.
	var bound []*v1.Pod
	seen := map[types.UID]bool{}
	for _, p := range append(e.pods(), assumed...) {
		if p.Spec.NodeName != "" && !seen[p.UID] {
			seen[p.UID] = true
			bound = append(bound, p)
		}
	}
	e.snapshot.set(cache.NewSnapshot(bound, e.nodes))
	state := framework.NewCycleState()
	res, st, _ := e.fw.RunPreFilterPlugins(e.ctx, state, pod)
	if !st.IsSuccess() {
		return state, "", map[string]*fwk.Status{"": st}
	}
	infos, _ := e.snapshot.NodeInfos().List()
	var feasible []fwk.NodeInfo
	statuses := map[string]*fwk.Status{}
	for _, ni := range infos {
		// As kube-scheduler: a node outside the PreFilterResult is not filtered.
		if !res.AllNodes() && !res.NodeNames.Has(ni.Node().Name) {
			statuses[ni.Node().Name] = fwk.NewStatus(fwk.UnschedulableAndUnresolvable, notPreFiltered)
			continue
		}
		if st := e.fw.RunFilterPlugins(e.ctx, state, pod, ni); st.IsSuccess() {
			feasible = append(feasible, ni)
		} else {
			statuses[ni.Node().Name] = st
		}
	}
	if len(feasible) == 0 {
		return state, "", statuses
	}
	if st := e.fw.RunPreScorePlugins(e.ctx, state, pod, feasible); !st.IsSuccess() {
		e.t.Fatalf("prescore: %v", st)
	}
	scores, st := e.fw.RunScorePlugins(e.ctx, state, pod, feasible)
	if !st.IsSuccess() {
		e.t.Fatalf("score: %v", st)
	}
	best := slices.MaxFunc(scores, func(a, b fwk.NodePluginScores) int { return int(a.TotalScore - b.TotalScore) })
	if st := e.fw.RunReservePluginsReserve(e.ctx, state, pod, best.Name); !st.IsSuccess() {
		e.t.Fatalf("reserve: %v", st)
	}
	return state, best.Name, statuses
}

// notPreFiltered is the status cycle gives the nodes outside the PreFilterResult.
const notPreFiltered = "not in the PreFilterResult"

// schedule creates the pod and runs a cycle and the binding; it returns the bound pod, or
// nil and the node statuses.
func (e *env) schedule(pod *v1.Pod) (*v1.Pod, map[string]*fwk.Status) {
	e.t.Helper()
	if _, err := e.client.CoreV1().Pods(pod.Namespace).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	state, node, statuses := e.cycle(pod)
	if node == "" {
		return nil, statuses
	}
	if st := e.fw.RunBindPlugins(e.ctx, state, pod, node); !st.IsSuccess() {
		e.t.Fatalf("bind: %v", st)
	}
	return e.pod(pod.Name), nil
}

// realise stores recs, realised, on the bound pod p, as its node's device plugin does.
func (e *env) realise(p *v1.Pod, recs []api.MigReservation) {
	e.t.Helper()
	raw, err := api.EncodeMigReservations(recs)
	if err != nil {
		e.t.Fatal(err)
	}
	p.Annotations[api.MigReservationsAnnotation] = raw
	if _, err := e.client.CoreV1().Pods(p.Namespace).Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) mustSchedule(pod *v1.Pod) []api.MigReservation {
	e.t.Helper()
	bound, statuses := e.schedule(pod)
	if bound == nil {
		e.t.Fatalf("pod %s unschedulable: %s", pod.Name, reasons(statuses))
	}
	recs, err := api.DecodeMigReservations(bound.Annotations[api.MigReservationsAnnotation])
	if err != nil {
		e.t.Fatalf("pod %s: %v", pod.Name, err)
	}
	return recs
}

// gpuNode is a node with the inventory of simulated GPUs in mode.
func gpuNode(t testing.TB, name, mode string, models ...string) *v1.Node {
	return fixture.Node(t, name, mode, models...)
}

func heartbeat(node string, renewed time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: api.HeartbeatLeaseName(node), Namespace: api.DefaultSystemNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &metav1.MicroTime{Time: renewed}},
	}
}

var podSeq int

// gpuPod is a pod of namespace default whose containers ask for {devices, MiB per
// device}, in mode, with a UID of its own (the fake clientset assigns none).
func gpuPod(name, mode string, containers ...[2]int) *v1.Pod {
	podSeq++
	p := fixture.GPUPod("default", name, mode, containers...)
	p.UID = types.UID(fmt.Sprintf("uid-%s-%d", name, podSeq))
	return p
}

func placements(recs []api.MigReservation) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.Profile+r.Placement.String())
	}
	return out
}

func reasons(statuses map[string]*fwk.Status) string {
	var out []string
	for n, st := range statuses {
		out = append(out, n+": "+strings.Join(st.Reasons(), "; "))
	}
	slices.Sort(out)
	return strings.Join(out, " | ")
}

func TestSeedExample(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "mig-node", api.ModeMIG, "NVIDIA A100-PCIE-40GB")})
	recs := e.mustSchedule(gpuPod("gpu-pod1", api.ModeMIG, [2]int{2, 8000}))
	if got := placements(recs); !slices.Equal(got, []string{"2g.10gb[0,2)", "2g.10gb[2,4)"}) {
		t.Errorf("gpu-pod1: %v", got)
	}
	recs = e.mustSchedule(gpuPod("mig-workload", api.ModeMIG, [2]int{1, 8000}))
	if got := placements(recs); !slices.Equal(got, []string{"2g.10gb[4,6)"}) {
		t.Errorf("mig-workload: %v", got)
	}
	p := e.pod("gpu-pod1")
	if p.Spec.NodeName != "mig-node" || p.Annotations[api.AssignedNodeAnnotation] != "mig-node" || p.Annotations[api.BindTimeAnnotation] == "" {
		t.Errorf("binding annotations: %v", p.Annotations)
	}
	// Each reservation is signed by the key the scheduler published for the device plugins.
	cm, err := e.client.CoreV1().ConfigMaps(api.DefaultSystemNamespace).Get(e.ctx, api.PublicKeysConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := signing.PublicKeys(cm)
	if err != nil || len(keys) != 1 {
		t.Fatalf("published keys %v, %v", keys, err)
	}
	verifier := signing.NewStaticVerifier(slices.Collect(maps.Values(keys))...)
	for _, name := range []string{"gpu-pod1", "mig-workload"} {
		if err := verifier.Verify(e.pod(name)); err != nil {
			t.Error(err)
		}
	}
	// One write per GPU pod, the Binding; the Leases are only watched.
	writes := 0
	for _, a := range e.client.Actions() {
		if r := a.GetResource().Resource; r == "leases" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			t.Errorf("the scheduler did more than watch Leases: %s %s", a.GetVerb(), r)
		}
		if a.GetVerb() != "create" && a.GetVerb() != "update" && a.GetVerb() != "patch" {
			continue
		}
		if a.GetResource().Resource == "pods" && a.GetSubresource() == "" {
			continue // the test's own pod creations
		}
		if r := a.GetResource().Resource; r == "secrets" || r == "configmaps" {
			continue // the signing key, made once when the plugin starts
		}
		writes++
	}
	if writes != 2 {
		t.Errorf("writes for two GPU pods: %d, want 2 (a Binding each)", writes)
	}
	// One event from the plugin: gpu-pod1's container got two MIG devices.
	var events []string
	for len(e.events.Events) > 0 {
		events = append(events, <-e.events.Events)
	}
	if len(events) != 1 || !strings.Contains(events[0], "MultipleMIGDevices") || !strings.Contains(events[0], "2 MIG devices") {
		t.Errorf("events: %q", events)
	}
}

func TestSmallestProfileAcrossModels(t *testing.T) {
	for _, tc := range []struct {
		model   string
		memory  int
		profile string
	}{
		{"A30", 5000, "1g.6gb"},
		{"A100-80GB", 8000, "1g.10gb"},
		{"H100-80GB", 12000, "2g.20gb"},
		{"NVIDIA H200", 8000, "1g.18gb"},
		{"B200", 30000, "2g.45gb"},
		{"RTX PRO 6000 Blackwell Server Edition", 30000, "2g.48gb"},
		{"A100-40GB", 0, "7g.40gb"}, // no memory asked: the whole GPU
	} {
		t.Run(tc.model, func(t *testing.T) {
			e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, tc.model)})
			recs := e.mustSchedule(gpuPod("p", api.ModeMIG, [2]int{1, tc.memory}))
			if recs[0].Profile != tc.profile {
				t.Errorf("%d MiB on %s: %s, want %s", tc.memory, tc.model, recs[0].Profile, tc.profile)
			}
		})
	}
}

func TestExhaustionThenReuse(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB")})
	e.mustSchedule(gpuPod("a", api.ModeMIG, [2]int{1, 19000}))
	e.mustSchedule(gpuPod("b", api.ModeMIG, [2]int{1, 19000}))
	pending, statuses := e.schedule(gpuPod("c", api.ModeMIG, [2]int{1, 4000}))
	if pending != nil {
		t.Fatalf("c fit on a full GPU")
	}
	if got := reasons(statuses); !strings.Contains(got, string(placement.ReasonPlacementsTaken)) {
		t.Fatalf("reasons: %s", got)
	}
	if statuses["n"].Code() != fwk.Unschedulable {
		t.Errorf("a full GPU is resolvable by deletion: %v", statuses["n"].Code())
	}
	// Deleting b frees its placement, the deletion requeues c, and c lands there.
	freed := e.pod("b")
	freedRecs, _ := api.DecodeMigReservations(freed.Annotations[api.MigReservationsAnnotation])
	if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if hint, _ := e.pl.isSchedulableAfterPodDelete(klog.Background(), e.pod("c"), freed, nil); hint != fwk.Queue {
		t.Errorf("deleting a GPU pod must requeue")
	}
	c := e.pod("c")
	state, node, _ := e.cycle(c)
	if node != "n" {
		t.Fatal("c still does not fit")
	}
	if st := e.fw.RunBindPlugins(e.ctx, state, c, node); !st.IsSuccess() {
		t.Fatal(st)
	}
	recs, _ := api.DecodeMigReservations(e.pod("c").Annotations[api.MigReservationsAnnotation])
	if got, in := recs[0].Placement, freedRecs[0].Placement; got.Start < in.Start || got.End() > in.End() {
		t.Errorf("c should reuse b's freed %v: got %v", in, got)
	}
}

// runtimeObject lets tests collect objects for newEnv.
type runtimeObject = runtime.Object

// recordingActivator records the pods the plugin activates.
type recordingActivator struct {
	mu        sync.Mutex
	activated map[string]int // activations per pod
}

func (a *recordingActivator) Activate(_ klog.Logger, pods map[string]*v1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.activated == nil {
		a.activated = map[string]int{}
	}
	for k := range pods {
		a.activated[k]++
	}
}

// count is how often key was activated.
func (a *recordingActivator) count(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.activated[key]
}

// waitFor runs trigger and reports whether key gets activated within a few seconds.
func (a *recordingActivator) waitFor(t *testing.T, key string, trigger func()) bool {
	trigger()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if a.count(key) > 0 {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

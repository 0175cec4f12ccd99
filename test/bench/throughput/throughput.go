// Package throughput measures dynamig-scheduler's scheduling throughput: the real
// scheduler (test/cluster.StartScheduler) against the in-process etcd and kube-apiserver,
// with plain Node objects carrying the inventory of 8 simulated A100-40GB GPUs each, fresh
// heartbeat Leases, and, in scenario (f), a stand-in device plugin that makes the device
// plugin's one write per GPU pod (cluster.StandInWrite) as soon as the pod is bound.
//
// Scenarios per node count and client QPS (Scenarios): (a) default plugins only, CPU pods;
// (b) DynamicMIG (the shipped configuration), GPU pods on the MIG nodes; (c) DynamicMIG,
// CPU pods; (d) (a) with kube-scheduler's batching off; (e) the allocator behind an HTTP
// scheduler extender, GPU pods; (f) (b) with the stand-in device plugin's writes; (g) the
// GPU pods under the default plugins alone, batching off: what kube-scheduler itself spends
// on a pod with extended resources that is never batched, without DynamicMIG; (j) (b) with
// batching off; the floor (h) and (i): no scheduler, the harness binds CPU and GPU pods
// deciding nothing (binder). Each reports pods bound per second, creation-to-bound latency,
// the process's CPU time per pod, the scheduler's writes counted at the API server (audit
// log), and the process's peak RSS.
package throughput

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/test/cluster"
)

// SchedulerName is the profile of the shipped configuration, which every pod names.
const SchedulerName = "dynamig-scheduler"

// QPS is one client rate limit of the scheduler (clientConnection qps and burst).
type QPS struct {
	QPS   float64
	Burst int
}

func (q QPS) String() string { return fmt.Sprintf("%g/%d", q.QPS, q.Burst) }

// DefaultQPS is kube-scheduler's default client rate limit; HighQPS all but lifts it.
var (
	DefaultQPS = QPS{QPS: 50, Burst: 100}
	HighQPS    = QPS{QPS: 5000, Burst: 5000}
)

// Scenario is one of the measured workloads.
type Scenario struct {
	Key     string // "a" to "j"
	Name    string
	Profile Profile
	GPU     bool
	// NoBatching runs the scheduler with the OpportunisticBatching feature off.
	NoBatching bool
	// StandIn runs the stand-in device plugin: one pod patch per GPU pod once bound, in the
	// same process (on 2 cores, CPU the scheduler does not get).
	StandIn bool
	// Mixed: the mixed cluster's run (Config.Mixed), reported as MixedGPU and MixedCPU.
	Mixed bool
}

// DefaultSchedulerName is the profile of the default scheduler the mixed cluster runs beside
// dynamig-scheduler, with kube-scheduler's default plugins (DefaultPlugins).
const DefaultSchedulerName = "default-scheduler"

// The mixed cluster's two results: GPU pods for the shipped profile and CPU pods for a default
// scheduler running beside dynamig-scheduler in the same process (as a cluster's CPU pods are
// scheduled), both created side by side.
var (
	MixedGPU = Scenario{Key: "mg", Name: "mixed cluster: GPU pods, DynamicMIG", Profile: WithDynamicMIG, GPU: true, Mixed: true}
	MixedCPU = Scenario{Key: "mc", Name: "mixed cluster: CPU pods, the default scheduler beside it", Profile: DefaultPlugins, Mixed: true}
)

// Scenarios are (a), (b), (c) and the references (d) to (g), in their default order.
var Scenarios = []Scenario{
	{Key: "a", Name: "default plugins, CPU pods", Profile: DefaultPlugins},
	{Key: "c", Name: "DynamicMIG, CPU pods", Profile: WithDynamicMIG},
	{Key: "d", Name: "default plugins, CPU pods, batching off", Profile: DefaultPlugins, NoBatching: true},
	{Key: "b", Name: "DynamicMIG, GPU pods", Profile: WithDynamicMIG, GPU: true},
	{Key: "f", Name: "DynamicMIG, GPU pods, with the stand-in device plugin's write", Profile: WithDynamicMIG, GPU: true, StandIn: true},
	{Key: "g", Name: "default plugins, GPU pods (no DynamicMIG), batching off", Profile: DefaultPlugins, GPU: true, NoBatching: true},
	{Key: "e", Name: "default plugins + the allocator as an HTTP extender, GPU pods", Profile: Extender, GPU: true},
	{Key: "j", Name: "DynamicMIG, GPU pods, batching off", Profile: WithDynamicMIG, GPU: true, NoBatching: true},
	{Key: "h", Name: "no scheduler, CPU pods: the harness binds each to the next node", Profile: NoScheduler},
	{Key: "i", Name: "no scheduler, GPU pods: the harness binds each to the next node with DynamicMIG's annotations", Profile: NoScheduler, GPU: true},
}

// Config is one benchmark run.
type Config struct {
	// SchedulerConfig is the shipped KubeSchedulerConfiguration (manifests/scheduler-config.yaml).
	SchedulerConfig string
	// Nodes are the node counts, run in increasing order.
	Nodes []int
	// Order is the scenario keys in the order they run at each size and QPS (default: all
	// of Scenarios, in its order); scenarios not named are not run.
	Order []string
	// Pods is the number of pods of each scenario.
	Pods int
	// QPS are the scheduler client rate limits to run each scenario with.
	QPS []QPS
	// Rounds, when set, is how many times each QPS's scenarios run at each size (one per QPS,
	// default 1), each round in another order (order), and the report gives each scenario's
	// median round and every round's pods/s.
	Rounds []int
	// PercentageOfNodesToScore, when above 0, replaces the configuration's (every scenario):
	// kube-scheduler stops filtering a pod once it has found that share of the nodes
	// feasible, and at least 100 (0: the shipped configuration's, which leaves kube-scheduler's
	// adaptive default: 50 % minus 1 % per 125 nodes).
	PercentageOfNodesToScore int
	// Timeout bounds each scenario from its first create; pods not bound by then are
	// reported as such (default 5 min + 100 ms per pod).
	Timeout time.Duration
	// CreateWorkers is how many goroutines create a scenario's pods (default 8).
	CreateWorkers int
	// CPUProfile, if set, is where the CPU profile of the whole process during scenario
	// ProfileScenario (default "b") at the largest node count and the last QPS is written.
	CPUProfile      string
	ProfileScenario string
	// Mixed, when Nodes > 0, runs the mixed cluster after every size: GPUNodes of the nodes
	// are GPU nodes as above, the others CPU nodes (no inventory, no nvidia.com/gpu), and
	// Pods GPU pods and Pods CPU pods are created side by side at the last QPS.
	Mixed MixedCluster
	// Log receives the API server's and etcd's logs; nil discards them.
	Log io.Writer
	// Progress, if set, is told what runs.
	Progress func(string)
}

// MixedCluster is the mixed cluster's shape.
type MixedCluster struct{ Nodes, GPUNodes int }

// Result is one scenario at one node count and QPS.
type Result struct {
	Nodes    int
	QPS      QPS
	Scenario Scenario
	Round    int
	Pods     int
	Bound    int
	// Incomplete: not every pod was bound within the timeout; Span then ends at the timeout
	// and PodsPerSec is Bound over it.
	Incomplete bool
	// Span is from the first create request to the last pod seen bound.
	Span       time.Duration
	PodsPerSec float64
	// P50 and P99 are of each pod's time from its create request to its binding seen by
	// a watch.
	P50, P99 time.Duration
	// Writes are the scheduler's writes in the scenario (audit log, user
	// cluster.UserScheduler), by "verb resource[/subresource]", events excluded; Events
	// counts its event writes.
	Writes      map[string]int
	WritesTotal int
	Events      int
	// Refused are the scheduler's write attempts the API server answered with an error
	// (a Binding whose request failed, under load), by "verb resource code"; not in Writes.
	Refused      map[string]int
	RefusedTotal int
	// StandInWrites are the stand-in device plugin's writes (cluster.StandInWrite: one pod
	// patch per GPU pod).
	StandInWrites int64
	// Batch are kube-scheduler's batching counters over the scenario (the profile of its
	// pods).
	Batch BatchCounts
	// PeakRSSKiB is the process's VmHWM during the scenario (reset before it via
	// /proc/self/clear_refs when the kernel allows; ResetRSS says whether it did).
	PeakRSSKiB int64
	ResetRSS   bool
	// CPU is the whole process's CPU time (user and system, getrusage) from the first
	// create to the last pod seen bound: what the scenario's pods cost the process.
	CPU time.Duration
	// SchedulerCPU is the part of it the scheduler's goroutines spent (the CPU profile's
	// samples with schedulerLabels), not in the mixed cluster.
	SchedulerCPU time.Duration
}

// SchedulerCPUPerPod is the scheduler's own CPU time per pod bound.
func (r *Result) SchedulerCPUPerPod() time.Duration {
	return r.SchedulerCPU / time.Duration(max(r.Bound, 1))
}

// CPUPerPod is the process's CPU time per pod bound. In the mixed cluster both classes
// share the CPU time, so it is not reported there.
func (r *Result) CPUPerPod() time.Duration { return r.CPU / time.Duration(max(r.Bound, 1)) }

// Report is a whole run.
type Report struct {
	Config     Config
	Results    []Result
	Setup      time.Duration // the longest control plane start
	NodeSetup  time.Duration // the longest creation of a scenario's nodes
	MixedSetup time.Duration // creating the mixed cluster's nodes
	PeakRSSKiB int64         // the whole run's VmHWM (the largest seen)
	// ProfileTop is `go tool pprof -top` of the CPU profile, or why it is missing.
	ProfileTop   string
	ProfileLabel string
}

func (c *Config) progress(format string, args ...any) {
	if c.Progress != nil {
		c.Progress(fmt.Sprintf(format, args...))
	}
}

// Run runs every node count × QPS × scenario, then the mixed cluster, each on a control plane
// of its own (startEnv).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.CreateWorkers <= 0 {
		cfg.CreateWorkers = 8
	}
	if len(cfg.Nodes) == 0 || cfg.Pods <= 0 || len(cfg.QPS) == 0 {
		return nil, errors.New("throughput: nodes, pods and QPS are required")
	}
	for _, key := range append(slices.Clone(cfg.Order), cmp.Or(cfg.ProfileScenario, "b")) {
		if !slices.ContainsFunc(Scenarios, func(sc Scenario) bool { return sc.Key == key }) {
			return nil, fmt.Errorf("throughput: no scenario %q (known: a to j)", key)
		}
	}
	nodes := slices.Clone(cfg.Nodes)
	slices.Sort(nodes)
	rep := &Report{Config: cfg}
	tmpl, err := newNodeTemplate()
	if err != nil {
		return nil, err
	}
	seq := 0
	for ni, n := range nodes {
		for qi, q := range cfg.QPS {
			rounds := cfg.rounds(qi)
			for round := range rounds {
				for _, sc := range cfg.order(round) {
					seq++
					profile := cfg.CPUProfile != "" && sc.Key == cmp.Or(cfg.ProfileScenario, "b") && ni == len(nodes)-1 && qi == len(cfg.QPS)-1 && round == rounds-1
					if err := rep.runRound(ctx, cfg, tmpl, seq, n, q, sc, round, profile); err != nil {
						return nil, fmt.Errorf("nodes %d, qps %s, scenario (%s): %w", n, q, sc.Key, err)
					}
				}
			}
		}
	}
	if m := cfg.Mixed; m.Nodes > 0 {
		if err := runMixed(ctx, tmpl, seq, cfg, rep); err != nil {
			return nil, fmt.Errorf("the mixed cluster: %w", err)
		}
	}
	rep.PeakRSSKiB = max(rep.PeakRSSKiB, vmHWM())
	return rep, nil
}

// runRound runs one round of scenario sc at n nodes and QPS q on a control plane of its own
// and adds its result to the report (profiled when profile is set).
func (rep *Report) runRound(ctx context.Context, cfg Config, tmpl *nodeTemplate, seq, n int, q QPS, sc Scenario, round int, profile bool) error {
	cfg.progress("nodes %d, qps %s, round %d, (%s) %s", n, q, round+1, sc.Key, sc.Name)
	e, err := startEnv(ctx, cfg, tmpl, n, 0, q, sc.Profile)
	if err != nil {
		return err
	}
	rep.noteSetup(e)
	results, err := runScenario(ctx, e.cp, e.admin, e.dp, tmpl, e.config, "", seq, n, q, sc, cfg, profile)
	e.stop()
	if err != nil {
		return err
	}
	res := results[0]
	res.Round = round
	if profile {
		rep.ProfileLabel = fmt.Sprintf("(%s) %s, %d nodes, %d pods, QPS %s", sc.Key, sc.Name, n, cfg.Pods, q)
		rep.ProfileTop = profileTop(cfg.CPUProfile)
	}
	if res.Incomplete {
		cfg.progress("  INCOMPLETE: not every pod bound within the timeout")
	}
	cfg.progress("  %d/%d bound in %.1fs: %.1f pods/s, p50 %s p99 %s, scheduler writes %d (+%d refused, +%d events), RSS peak %d MiB, batching hints used %.0f (flushed: %s)",
		res.Bound, res.Pods, res.Span.Seconds(), res.PodsPerSec, res.P50.Round(time.Millisecond), res.P99.Round(time.Millisecond),
		res.WritesTotal, res.RefusedTotal, res.Events, res.PeakRSSKiB/1024, res.Batch.hintUsed(), res.Batch.flushes())
	rep.Results = append(rep.Results, *res)
	rep.PeakRSSKiB = max(rep.PeakRSSKiB, res.PeakRSSKiB)
	return nil
}

// env is one scenario's control plane: its own etcd and API server, so that no scenario
// runs on another's history. With one control plane for a whole run, the API server's watch
// cache kept every scenario's pod events after its pods were deleted (the live heap after
// clearing grew 490, 856, 1095 MiB over three scenarios at 1000 nodes), and a scenario ran
// up to 13 % slower in fourth place than in first.
type env struct {
	cp        *cluster.ControlPlane
	admin, dp kubernetes.Interface
	// config is the scheduler's configuration for the scenario's profile and QPS.
	config    string
	start     time.Duration // the control plane's start
	nodeSetup time.Duration // creating the nodes
	stop      func()
}

// startEnv starts a control plane with gpuNodes GPU nodes and cpuNodes CPU nodes, and writes
// the scheduler configuration of profile at q (starting the extender for Extender).
func startEnv(ctx context.Context, cfg Config, tmpl *nodeTemplate, gpuNodes, cpuNodes int, q QPS, profile Profile) (_ *env, err error) {
	t0 := time.Now()
	cp, err := cluster.StartProcess(ctx, cluster.Options{Log: cfg.Log})
	if err != nil {
		return nil, err
	}
	// The extender's informers stop before the API server does: their open watches would
	// hold its shutdown for its whole grace period.
	extCtx, stopExtender := context.WithCancel(ctx)
	e := &env{cp: cp, start: time.Since(t0), stop: func() {
		stopExtender()
		cp.Stop()
		runtime.GC()
		debug.FreeOSMemory()
	}}
	defer func() {
		if err != nil {
			e.stop()
		}
	}()
	if e.admin, err = kubernetes.NewForConfig(protobuf(cp.UserConfig(cluster.UserAdmin))); err != nil {
		return nil, err
	}
	if e.dp, err = cp.Client(cluster.UserDevicePlugin); err != nil {
		return nil, err
	}
	if _, err := e.admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: warmupNS}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	url := ""
	if profile == Extender {
		// Its client is limited like the scheduler's.
		ec := cp.UserConfig(cluster.UserScheduler)
		ec.QPS, ec.Burst = float32(q.QPS), q.Burst
		client, err := kubernetes.NewForConfig(ec)
		if err != nil {
			return nil, err
		}
		var ext *extender
		pprof.Do(extCtx, schedulerLabels, func(ctx context.Context) { ext, err = startExtender(ctx, client) })
		if err != nil {
			return nil, fmt.Errorf("starting the extender: %w", err)
		}
		url = ext.URL()
	}
	if e.config, err = cp.SchedulerConfig(cfg.SchedulerConfig, configEdit(profile, q.QPS, q.Burst, cfg.PercentageOfNodesToScore, url)); err != nil {
		return nil, err
	}
	t1 := time.Now()
	if err := addNodes(ctx, e.admin, e.dp, tmpl, 0, gpuNodes); err != nil {
		return nil, err
	}
	if err := addCPUNodes(ctx, e.admin, cpuNodes); err != nil {
		return nil, err
	}
	e.nodeSetup = time.Since(t1)
	return e, nil
}

// noteSetup keeps the longest control plane start and node creation seen.
func (r *Report) noteSetup(e *env) {
	r.Setup = max(r.Setup, e.start)
	r.NodeSetup = max(r.NodeSetup, e.nodeSetup)
}

// runMixed runs the mixed cluster (cfg.Mixed) at the last QPS, with the default scheduler
// beside dynamig-scheduler.
func runMixed(ctx context.Context, tmpl *nodeTemplate, seq int, cfg Config, rep *Report) error {
	m := cfg.Mixed
	if m.GPUNodes < 0 || m.GPUNodes > m.Nodes {
		return fmt.Errorf("%d GPU nodes of %d", m.GPUNodes, m.Nodes)
	}
	q := cfg.QPS[len(cfg.QPS)-1]
	cfg.progress("nodes %d (%d GPU), qps %s, mixed: GPU pods beside CPU pods", m.Nodes, m.GPUNodes, q)
	e, err := startEnv(ctx, cfg, tmpl, m.GPUNodes, m.Nodes-m.GPUNodes, q, WithDynamicMIG)
	if err != nil {
		return err
	}
	defer e.stop()
	rep.MixedSetup = e.nodeSetup
	// The default scheduler writes as the admin, so that the scheduler's writes counted are
	// dynamig-scheduler's alone.
	kubeconfig, err := e.cp.WriteKubeconfig(cluster.UserAdmin)
	if err != nil {
		return err
	}
	defaultConfig, err := e.cp.SchedulerConfigAs(cfg.SchedulerConfig, kubeconfig,
		configEdit(DefaultPlugins, q.QPS, q.Burst, cfg.PercentageOfNodesToScore, ""), renameProfile(DefaultSchedulerName))
	if err != nil {
		return err
	}
	results, err := runScenario(ctx, e.cp, e.admin, e.dp, tmpl, e.config, defaultConfig, seq+1, m.Nodes, q, MixedGPU, cfg, false)
	if err != nil {
		return err
	}
	for _, res := range results {
		cfg.progress("  (%s) %d/%d bound in %.1fs: %.1f pods/s, p50 %s p99 %s, batching hints used %.0f (flushed: %s)", res.Scenario.Key,
			res.Bound, res.Pods, res.Span.Seconds(), res.PodsPerSec, res.P50.Round(time.Millisecond), res.P99.Round(time.Millisecond), res.Batch.hintUsed(), res.Batch.flushes())
		rep.Results = append(rep.Results, *res)
		rep.PeakRSSKiB = max(rep.PeakRSSKiB, res.PeakRSSKiB)
	}
	return nil
}

const warmupNS = "tp-warmup"

// podClass is one kind of pod a scenario creates: its result's scenario, its scheduler and
// its name prefix.
type podClass struct {
	sc        Scenario
	scheduler string
	prefix    string
}

// runScenario runs one scenario: a scheduler from schedConfig (the binder instead where
// sc.Profile is NoScheduler), and in the mixed cluster (sc.Mixed) the default scheduler from
// besideConfig beside it; one result per class of pods.
func runScenario(ctx context.Context, cp *cluster.ControlPlane, admin, dp kubernetes.Interface, tmpl *nodeTemplate, schedConfig, besideConfig string,
	seq, nodes int, q QPS, sc Scenario, cfg Config, profile bool) (_ []*Result, err error) {
	classes := []podClass{{sc: sc, scheduler: SchedulerName, prefix: "pod"}}
	if sc.Mixed {
		classes = []podClass{{sc: MixedGPU, scheduler: SchedulerName, prefix: "gpu"}, {sc: MixedCPU, scheduler: DefaultSchedulerName, prefix: "cpu"}}
	}
	total := cfg.Pods * len(classes)
	ns := fmt.Sprintf("tp-%d-%s", seq, sc.Key)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	// The stand-in device plugin makes the device plugin's one write for each GPU pod once
	// it is bound: a pod patch with the runtime identity and bind-phase success.
	standIn, stopStandIn := (*cluster.StandIn)(nil), func() {}
	if sc.StandIn {
		standIn, stopStandIn = cluster.StartStandIn(ctx, dp, ns, 16)
	}
	defer stopStandIn()

	// The watch that sees pods bound: of bound pods only (a field selector), their metadata
	// only, so that the measuring costs the process little and the same for every pod.
	bound := map[string]time.Time{}
	var mu sync.Mutex
	allBound := make(chan struct{})
	var closeOnce sync.Once
	record := func(obj any) {
		p, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return
		}
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if _, seen := bound[p.Name]; !seen {
			bound[p.Name] = now
			if len(bound) == total {
				closeOnce.Do(func() { close(allBound) })
			}
		}
	}
	wctx, stopWatch := context.WithCancel(ctx)
	meta, err := metadata.NewForConfig(protobuf(cp.UserConfig(cluster.UserAdmin)))
	if err != nil {
		stopWatch()
		return nil, err
	}
	factory := metadatainformer.NewFilteredSharedInformerFactory(meta, 0, ns, func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName!=" })
	inf := factory.ForResource(v1.SchemeGroupVersion.WithResource("pods")).Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: record, UpdateFunc: func(_, obj any) { record(obj) }})
	factory.Start(wctx.Done())
	factory.WaitForCacheSync(wctx.Done())
	defer func() {
		stopWatch()
		factory.Shutdown()
	}()

	// (d), (g) and (j) run with kube-scheduler's batching off.
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{string(features.OpportunisticBatching): !sc.NoBatching}); err != nil {
		return nil, err
	}
	defer func() {
		_ = utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{string(features.OpportunisticBatching): true})
	}()
	var stopSched func()
	pprof.Do(ctx, schedulerLabels, func(ctx context.Context) {
		if sc.Profile == NoScheduler {
			stopSched, err = startFloor(ctx, cp, tmpl, ns, nodes, q, sc.GPU)
		} else {
			stopSched, err = cluster.StartScheduler(ctx, cp, schedConfig)
		}
	})
	if err != nil {
		return nil, err
	}
	stopBeside := func() {}
	if sc.Mixed {
		if stopBeside, err = cluster.StartSchedulerBeside(ctx, cp, besideConfig); err != nil {
			stopSched()
			return nil, err
		}
	}
	stopped := false
	defer func() {
		if !stopped {
			stopSched()
			stopBeside()
		}
	}()
	// Warm up: a scheduler has synced its caches once it binds a pod (the binder has once
	// it starts).
	warmUp := classes
	if sc.Profile == NoScheduler {
		warmUp = nil
	}
	for _, c := range warmUp {
		warm := cpuPod(warmupNS, fmt.Sprintf("warmup-%d-%s", seq, c.prefix))
		warm.Spec.SchedulerName = c.scheduler
		if _, err := admin.CoreV1().Pods(warmupNS).Create(ctx, warm, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			p, err := admin.CoreV1().Pods(warmupNS).Get(ctx, warm.Name, metav1.GetOptions{})
			return err == nil && p.Spec.NodeName != "", nil
		}); err != nil {
			return nil, fmt.Errorf("%s did not bind a warm-up pod: %w", c.scheduler, err)
		}
		_ = admin.CoreV1().Pods(warmupNS).Delete(ctx, warm.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}
	time.Sleep(500 * time.Millisecond) // let the warm-up pods' events and deletions pass

	batchBefore := make([]BatchCounts, len(classes))
	for i, c := range classes {
		if batchBefore[i], err = readBatchCounts(c.scheduler); err != nil {
			return nil, err
		}
	}
	resetRSS := resetPeakRSS()
	// Every scenario is profiled, for its scheduler's own CPU (schedulerLabels); the one the
	// report shows is kept in cfg.CPUProfile.
	var f *os.File
	if profile {
		f, err = os.Create(cfg.CPUProfile)
	} else if f, err = os.CreateTemp("", "throughput-*.pprof"); err == nil {
		defer os.Remove(f.Name())
	}
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("profiling the scenario: %w", err)
	}
	defer func() {
		pprof.StopCPUProfile()
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()

	// Pod i is of class i mod the classes: a mixed scenario's classes are created side by side.
	cpuBefore := processCPU()
	since := time.Now()
	created := make([]time.Time, total)
	names := make([]string, total)
	err = parallel(cfg.CreateWorkers, total, func(i int) error {
		c := classes[i%len(classes)]
		name := fmt.Sprintf("%s-%05d", c.prefix, i/len(classes))
		names[i] = name
		p := cpuPod(ns, name)
		if c.sc.GPU {
			p = gpuPod(ns, name)
		}
		p.Spec.SchedulerName = c.scheduler
		created[i] = time.Now()
		_, err := admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("creating pods: %w", err)
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = 5*time.Minute + time.Duration(total)*100*time.Millisecond
	}
	timeout -= time.Since(since)
	select {
	case <-allBound:
	case <-time.After(timeout):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	pprof.StopCPUProfile()
	peak, cpu := vmHWM(), processCPU()-cpuBefore
	var results []*Result
	for i, c := range classes {
		after, err := readBatchCounts(c.scheduler)
		if err != nil {
			return nil, err
		}
		results = append(results, &Result{Nodes: nodes, QPS: q, Scenario: c.sc, Pods: cfg.Pods, PeakRSSKiB: peak, ResetRSS: resetRSS, CPU: cpu, Batch: after.since(batchBefore[i])})
	}
	if !sc.Mixed {
		if results[0].SchedulerCPU, err = labelledCPU(ctx, f.Name(), partLabel, schedulerPart); err != nil {
			return nil, fmt.Errorf("the scheduler's CPU: %w", err)
		}
	}
	stopSched()
	stopBeside()
	stopped = true
	until := time.Now()

	mu.Lock()
	for ci, res := range results {
		var first, last time.Time
		lat := make([]time.Duration, 0, cfg.Pods)
		for i := ci; i < total; i += len(classes) {
			if first.IsZero() || created[i].Before(first) {
				first = created[i]
			}
			if t, ok := bound[names[i]]; ok {
				res.Bound++
				lat = append(lat, t.Sub(created[i]))
				if t.After(last) {
					last = t
				}
			}
		}
		res.Span = last.Sub(first)
		if res.Bound < res.Pods {
			res.Incomplete = true
			res.Span = until.Sub(first)
		}
		res.PodsPerSec = float64(res.Bound) / res.Span.Seconds()
		slices.Sort(lat)
		res.P50, res.P99 = percentile(lat, 0.50), percentile(lat, 0.99)
	}
	mu.Unlock()
	res := results[0] // the scheduler's writes are dynamig-scheduler's: the first class's

	// The audit record is written as each response completes: let the last ones land.
	time.Sleep(time.Second)
	res.Writes, res.Refused, res.Events, err = schedulerWrites(cp, since, until)
	if err != nil {
		return nil, err
	}
	for _, n := range res.Writes {
		res.WritesTotal += n
	}
	for _, n := range res.Refused {
		res.RefusedTotal += n
	}
	stopStandIn()
	if standIn != nil {
		res.StandInWrites = standIn.Writes()
	}

	return results, nil
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func podResources() v1.ResourceRequirements {
	return v1.ResourceRequirements{Requests: v1.ResourceList{
		v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("128Mi")}}
}

func cpuPod(ns, name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.PodSpec{SchedulerName: SchedulerName, Containers: []v1.Container{{Name: "c", Image: "busybox", Resources: podResources()}}}}
}

// gpuPod asks for one MIG device of 4000 MiB (a 1g.5gb instance on an A100-40GB).
func gpuPod(ns, name string) *v1.Pod {
	p := cpuPod(ns, name)
	p.Annotations = map[string]string{api.VGPUModeAnnotation: api.ModeMIG}
	p.Spec.Containers[0].Resources.Limits = v1.ResourceList{
		api.ResourceCount:  resource.MustParse("1"),
		api.ResourceMemory: resource.MustParse("4000"),
	}
	return p
}

// schedulerWrites counts the writes the scheduler's identity made in [since, until], as
// "verb resource[/subresource]", those the server refused apart (with the code); events
// are only counted, and the one-time setup of its signing key is left out.
func schedulerWrites(cp *cluster.ControlPlane, since, until time.Time) (writes, refused map[string]int, events int, err error) {
	evs, err := cp.AuditEvents()
	if err != nil {
		return nil, nil, 0, err
	}
	writes, refused = map[string]int{}, map[string]int{}
	for _, ev := range evs {
		if ev.Stage != auditv1.StageResponseComplete || ev.User.Username != cluster.UserScheduler {
			continue
		}
		if t := ev.RequestReceivedTimestamp.Time; t.Before(since) || t.After(until) || cluster.SigningKeySetup(ev) {
			continue
		}
		key := ev.Verb + " " + ev.RequestURI
		if r := ev.ObjectRef; r != nil {
			if r.Resource == "events" {
				events++
				continue
			}
			key = ev.Verb + " " + r.Resource
			if r.Subresource != "" {
				key += "/" + r.Subresource
			}
		}
		if st := ev.ResponseStatus; st != nil && st.Code >= 300 {
			refused[fmt.Sprintf("%s %d", key, st.Code)]++
			continue
		}
		writes[key]++
	}
	return writes, refused, events, nil
}

// resetPeakRSS resets the process's VmHWM to its current RSS (Linux ≥ 4.0: write 5 to
// /proc/self/clear_refs) and says whether it could.
func resetPeakRSS() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// vmHWM is the process's peak resident set size in KiB (/proc/self/status VmHWM), 0 if
// unknown.
func vmHWM() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

// profileTop is `go tool pprof -top` of the profile (the profile carries its symbols), or
// why it could not be had. github.com/google/pprof is not a direct requirement of the
// module, so its parser is not used here.
func profileTop(path string) string {
	var b strings.Builder
	// The last listing keeps only the samples with a DynamicMIG frame: the plugin's cost.
	for _, args := range [][]string{{"-top"}, {"-top", "-cum"}, {"-top", "-cum", "-focus=plugins/dynamicmig"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := append([]string{"tool", "pprof"}, args...)
		cmd = append(cmd, "-nodecount=30", path)
		out, err := exec.CommandContext(ctx, "go", cmd...).CombinedOutput()
		cancel()
		fmt.Fprintf(&b, "$ go %s\n", strings.Join(cmd, " "))
		if err != nil {
			fmt.Fprintf(&b, "failed: %v\n", err)
		}
		b.Write(out)
		b.WriteString("\n")
	}
	return b.String()
}

// RedirectKlog sends klog's output (the API server's and the scheduler's logs) to w only.
func RedirectKlog(w io.Writer) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	// k8s.io/kubernetes/test/utils/ktesting (which test/cluster imports) sets verbosity 5
	// at init: logging that much would be a large part of what is measured.
	_ = fs.Set("v", "0")
	klog.SetOutput(w)
}

// scenarios are the scenarios to run, in cfg.Order.
// order is the scenarios of round (from 0), rotated by round: each round starts one scenario
// later, so that over as many rounds as scenarios each runs once in each place (a scenario's
// rate still drifts with its place in the process's run by up to ~10 %).
func (cfg Config) order(round int) []Scenario {
	sc := cfg.scenarios()
	if len(sc) == 0 {
		return nil
	}
	k := round % len(sc)
	return append(slices.Clone(sc[k:]), sc[:k]...)
}

// rounds is how many rounds QPS qi runs (Rounds).
func (cfg Config) rounds(qi int) int {
	if qi < len(cfg.Rounds) && cfg.Rounds[qi] > 0 {
		return cfg.Rounds[qi]
	}
	return 1
}

func (cfg Config) scenarios() []Scenario {
	if len(cfg.Order) == 0 {
		return Scenarios
	}
	var out []Scenario
	for _, key := range cfg.Order {
		for _, sc := range Scenarios {
			if sc.Key == key {
				out = append(out, sc)
			}
		}
	}
	return out
}

// protobuf is c speaking protobuf, as kube-scheduler's and the kubelet's clients do: the pod
// creators' and watchers' encoding then costs the process what a component's would.
// startFloor starts the binder of the floor scenarios for namespace ns, as the scheduler's
// user, its client limited to q; the returned func stops it.
func startFloor(ctx context.Context, cp *cluster.ControlPlane, tmpl *nodeTemplate, ns string, nodes int, q QPS, gpu bool) (func(), error) {
	c := protobuf(cp.UserConfig(cluster.UserScheduler))
	c.QPS, c.Burst = float32(q.QPS), q.Burst
	client, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, err
	}
	bctx, stop := context.WithCancel(ctx)
	if err := startBinder(bctx, client, tmpl, ns, nodes, gpu); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// schedulerLabels mark, in the CPU profile, the goroutines of the scenario's scheduler (the
// floor's binder, the extender) and so every goroutine they start, which inherit them: its
// scheduling, binding, informers, event recording, its clients' encoding and decoding, and the
// garbage collection its allocations are charged with. Not marked: the API server, etcd, the
// harness, the runtime's background collection, and an HTTP/2 connection's read loop, which
// belongs to the goroutine that dialled.
var schedulerLabels = pprof.Labels(partLabel, schedulerPart)

const partLabel, schedulerPart = "part", "scheduler"

// labelledCPU is the CPU time of the profile's samples with label key set to value, read
// with `go tool pprof -tags`, which lists each label's values with their totals.
func labelledCPU(ctx context.Context, profile, key, value string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-tags", "-unit=ms", profile).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("go tool pprof -tags %s: %w: %s", profile, err, out)
	}
	return parseTagTotal(string(out), key, value)
}

// parseTagTotal reads value's total under key from `go tool pprof -tags -unit=ms` output, a
// line " key: Total 170ms of 530ms (32.08%)" and under it one per value,
// "       170ms (32.08%): value"; 0 when no sample carried the value.
func parseTagTotal(out, key, value string) (time.Duration, error) {
	inKey := false
	for _, line := range strings.Split(out, "\n") {
		t := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(t, key+": Total "):
			inKey = true
		case !strings.Contains(t, "): "):
			inKey = false // another key, or the end
		case inKey && strings.HasSuffix(t, "): "+value):
			amount, _, _ := strings.Cut(t, " ")
			ms, err := strconv.ParseFloat(strings.TrimSuffix(amount, "ms"), 64)
			if err != nil || !strings.HasSuffix(amount, "ms") {
				return 0, fmt.Errorf("pprof -tags: not an amount in ms: %q", line)
			}
			return time.Duration(ms * float64(time.Millisecond)), nil
		}
	}
	return 0, nil
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func protobuf(c *rest.Config) *rest.Config {
	c.ContentType = "application/vnd.kubernetes.protobuf"
	c.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return c
}

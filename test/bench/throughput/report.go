package throughput

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dynamig/dynamig/test/cluster"
)

// Machine describes where and how a report was made.
type Machine struct {
	Cores   int
	CPU     string
	At      string
	Command string
	Took    time.Duration
}

// find is the scenario's median round by pods/s (the lower middle one of an even count).
func (r *Report) find(nodes int, q QPS, key string) *Result {
	runs := r.rounds(nodes, q, key)
	if len(runs) == 0 {
		return nil
	}
	slices.SortStableFunc(runs, func(x, y *Result) int { return cmp.Compare(x.PodsPerSec, y.PodsPerSec) })
	return runs[(len(runs)-1)/2]
}

// rounds are the scenario's results, in the order of their rounds.
func (r *Report) rounds(nodes int, q QPS, key string) []*Result {
	var out []*Result
	for i := range r.Results {
		if x := &r.Results[i]; x.Nodes == nodes && x.QPS == q && x.Scenario.Key == key {
			out = append(out, x)
		}
	}
	return out
}

// roundRates is each round's pods/s of the scenario, and for a scenario other than (a),
// its ratio to (a) of the same round.
func (r *Report) roundRates(nodes int, q QPS, key string) string {
	a := r.rounds(nodes, q, "a")
	var parts []string
	for i, x := range r.rounds(nodes, q, key) {
		p := fmt.Sprintf("%.1f", x.PodsPerSec)
		if key != "a" && i < len(a) && a[i].PodsPerSec > 0 {
			p += fmt.Sprintf(" (%.2f)", x.PodsPerSec/a[i].PodsPerSec)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

// millis is d in milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// cpuMS is a CPU time per pod in milliseconds, to the hundredth.
func cpuMS(d time.Duration) string { return fmt.Sprintf("%.2f ms", millis(d)) }

// lowerMedian is the median of xs, the lower middle one of an even count; it sorts xs.
func lowerMedian[T cmp.Ordered](xs []T) T {
	slices.Sort(xs)
	return xs[(len(xs)-1)/2]
}

// roundRatios is the median of the scenario's own ratios to (a) round by round (the lower
// middle one of an even count), their range and how many of them are 1 or more, "—"
// without a round of both.
func (r *Report) roundRatios(nodes int, q QPS, key string) string {
	ratios := r.ratiosByRound(nodes, q, key, func(x *Result) float64 { return x.PodsPerSec })
	if len(ratios) == 0 {
		return "—"
	}
	median := lowerMedian(ratios)
	reach := 0
	for _, x := range ratios {
		if x >= 1 {
			reach++
		}
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f; %d of %d ≥ 1)", median, ratios[0], ratios[len(ratios)-1], reach, len(ratios))
}

// spread is the most any scenario's fastest round beat its slowest at one size and QPS, as
// a fraction of the slowest's pods/s, and where; ok is false without a scenario of several rounds.
func (r *Report) spread() (frac float64, nodes int, key string, ok bool) {
	for _, q := range r.Config.QPS {
		for _, n := range r.nodes() {
			for _, sc := range Scenarios {
				runs := r.rounds(n, q, sc.Key)
				if len(runs) < 2 {
					continue
				}
				lo, hi := runs[0].PodsPerSec, runs[0].PodsPerSec
				for _, x := range runs[1:] {
					lo, hi = min(lo, x.PodsPerSec), max(hi, x.PodsPerSec)
				}
				if lo > 0 && (!ok || hi/lo-1 > frac) {
					frac, nodes, key, ok = hi/lo-1, n, sc.Key, true
				}
			}
		}
	}
	return frac, nodes, key, ok
}

// spreadNote states the run's own noise: how far apart the rounds of one scenario came out.
func (r *Report) spreadNote() string {
	frac, nodes, key, ok := r.spread()
	if !ok {
		return " One round of each scenario, so this run measures no noise of its own."
	}
	return fmt.Sprintf(" Noise: the same scenario's rounds differ; in this run by up to %.0f %% (pods/s of its fastest round over its slowest, (%s) at %d nodes), "+
		"so a ratio within that of 1.0 in one round says little: the ratios table gives each round's too.", 100*frac, key, nodes)
}

// ratiosByRound are the scenario's figures over (a)'s of the same round, round by round.
func (r *Report) ratiosByRound(nodes int, q QPS, key string, figure func(*Result) float64) []float64 {
	a, x := r.rounds(nodes, q, "a"), r.rounds(nodes, q, key)
	var ratios []float64
	for i := range min(len(a), len(x)) {
		if fa := figure(a[i]); fa > 0 {
			ratios = append(ratios, figure(x[i])/fa)
		}
	}
	return ratios
}

// cpuPerPod is the median over the scenario's rounds of a CPU time per pod, the process's
// (Result.CPUPerPod) or its scheduler's (Result.SchedulerCPUPerPod), (the lower middle one
// of an even count), which need not be the median round's by pods/s, and each round's.
func (r *Report) cpuPerPod(nodes int, q QPS, key string, perPod func(*Result) time.Duration) (time.Duration, []time.Duration) {
	var each []time.Duration
	for _, x := range r.rounds(nodes, q, key) {
		each = append(each, perPod(x))
	}
	if len(each) == 0 {
		return 0, nil
	}
	return lowerMedian(slices.Clone(each)), each
}

// cpuCell is the scenario's median CPU per pod, with each round's when there are several.
func (r *Report) cpuCell(nodes int, q QPS, key string, perPod func(*Result) time.Duration) string {
	median, each := r.cpuPerPod(nodes, q, key, perPod)
	if len(each) < 2 {
		return cpuMS(median)
	}
	parts := make([]string, len(each))
	for i, d := range each {
		parts[i] = fmt.Sprintf("%.2f", millis(d))
	}
	return fmt.Sprintf("%s (%s)", cpuMS(median), strings.Join(parts, ", "))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", millis(d)) }

// WriteMarkdown writes the report as docs/benchmarks/throughput.md.
func (r *Report) WriteMarkdown(w io.Writer, m Machine) {
	fmt.Fprintf(w, "# Scheduling throughput\n\n")
	fmt.Fprintf(w, "Generated by `test/bench/throughput` (`make bench-throughput` runs the quick size). Do not edit by hand.\n\n")
	fmt.Fprintf(w, "- Date: %s\n- Machine: %d cores, %s\n- Command: `%s`\n- Run time: %.0f s (a control plane's start at most %.1f s, a scenario's nodes created in at most %.1f s)\n\n",
		m.At, m.Cores, m.CPU, m.Command, m.Took.Seconds(), r.Setup.Seconds(), r.NodeSetup.Seconds())
	fmt.Fprintf(w, "## Setup\n\n")
	fmt.Fprintf(w, "Everything runs in one process: an embedded etcd, the real kube-apiserver (`test/cluster`, audit log on), "+
		"the real dynamig-scheduler (kube-scheduler's `app.Setup`/`app.Run` with dynamig's registry, leader election off), "+
		"the pod creators and watchers, and in (f) a stand-in device plugin.\n\n")
	fmt.Fprintf(w, "- Nodes: plain Node objects, Ready, allocatable cpu 32, memory 256Gi, pods 110 and `nvidia.com/gpu` = 7 per GPU, "+
		"each with the inventory annotation of %d simulated %s in MIG mode (computed once by the device plugin's inventory code "+
		"over `nvml/sim`, GPU UUIDs made unique per node), and a fresh heartbeat Lease (duration %d s, so no renewals run).\n",
		GPUsPerNode, GPUModel, heartbeatDuration)
	fmt.Fprintf(w, "- Pods per scenario: %d, created by %d concurrent clients (admin, client QPS 1000). CPU pods request 100m cpu and 128Mi; "+
		"GPU pods additionally `nvidia.com/gpu: 1`, `nvidia.com/gpumem: 4000`, `nvidia.com/vgpu-mode: mig` (a 1g.5gb instance). "+
		"All name `schedulerName: %s`.\n",
		r.Config.Pods, r.Config.CreateWorkers, SchedulerName)
	fmt.Fprintf(w, "- Scenarios: (a) default plugins only: the shipped `manifests/scheduler-config.yaml` without its plugins section "+
		"(so kube-scheduler's default plugins at every extension point, NodeResourcesFit's score included, and DefaultBinder) and with the pluginConfig of DynamicMIG, "+
		"PodTopologySpread and InterPodAffinity dropped: kube-scheduler's default profile, "+
		"as CPU pods get it from a cluster's default scheduler (NodeResourcesFit's ignoredResources kept; no CPU pod requests them); CPU pods. (b) DynamicMIG (the shipped configuration), GPU pods; its PreFilter takes the GPU request's resources "+
		"out of NodeResourcesFit's request, so Fit validates no name of theirs on the nodes it filters, and its Filter checks the device count in Fit's place "+
		"(docs/architecture.md, \"No per-node name validation for the GPU request\"). "+
		"(c) DynamicMIG, CPU pods. (d), a reference when run (not by default; (g) supersedes it): (a) with kube-scheduler's OpportunisticBatching feature off. "+
		"Batching (kube-scheduler's opportunistic batching, on by default): in (a) no pod is batched, since PodTopologySpread's system default constraints "+
		"(defaultingType System, kube-scheduler's default) refuse to sign every pod, so (b)/(d) is the same comparison as (b)/(a); the shipped profile "+
		"((b), (c), (f)) sets PodTopologySpread's defaultingType List and InterPodAffinity's ignorePreferredTermsOfExistingPods, so its pods are signed "+
		"(GPU pods by DynamicMIG with their request's shape) and the next identical pod is filtered on the node the previous ranking hints, "+
		"with the last chosen node filtered and scored again first from 1.37 (the batching table gives kube-scheduler's own counters). (e), when run: (a)'s plugins plus the same allocator behind a kube-scheduler HTTP extender "+
		"(filter over the candidate node names, bind with the Binding carrying the reservation; the extender's writes are made as the scheduler's user), "+
		"HAMi's architecture, GPU pods: (b)/(e) is what the in-process design gains over it. The extender keeps the plugin's one write per pod; "+
		"HAMi v2.10 itself makes more (it patches the pod in filter and locks the node with a Node write). "+
		"(f): (b) plus the device plugin's write for each pod (below), made in the same process. "+
		"(g), a reference: (b)'s GPU pods under (a)'s default plugins, batching off: kube-scheduler's own cost for a pod with extended resources "+
		"(NodeResourcesFit validates each extended resource name on every node it filters) that is never batched; (b)/(g) is what DynamicMIG adds to it, "+
		"or saves (batching, and Fit's name validation taken away). (j), a reference when run: (b) with batching off.%s\n", r.floorSetup())
	fmt.Fprintf(w, "- Each scenario runs on a control plane of its own (etcd and API server started, nodes created, the Go heap collected after it stops) "+
		"and a scheduler of its own, so that none runs on another's history: with one control plane for the whole run, the API server's watch cache "+
		"kept every scenario's pod events after its pods were deleted (the live heap grew 490, 856, 1095 MiB after three scenarios at 1000 nodes), "+
		"and a scenario ran up to 13 %% slower in fourth place than in first, a GPU scenario more than a CPU one. "+
		"Order at each size and QPS: %s; %s.%s\n",
		orderList(r.Config), roundsNote(r.Config), r.spreadNote())
	fmt.Fprintf(w, "- Nothing writes for a bound pod but the scheduler in (a) to (e): no kubelet status for CPU pods, no device plugin for GPU pods, "+
		"so the ratios compare the scheduler's work. In (f) the stand-in device plugin (`test/cluster.StandIn`, user `%s`, its writes counted apart) "+
		"makes, as soon as a GPU pod is bound, the device plugin's one write for it once its containers' devices exist: %s. "+
		"In a cluster that write is served by the API server, not the scheduler's process; here it shares the 2 cores with the scheduler, "+
		"so (f)/(b) is what it costs this all-in-one process. "+
		"There is no hand-off Lease: the scheduler's Bind is the Binding alone.\n", cluster.UserDevicePlugin, cluster.StandInWrite)
	fmt.Fprintf(w, "- Client QPS: the scheduler's `clientConnection` qps/burst patched in the config copy: %s.\n", qpsList(r.Config.QPS))
	if n := r.Config.PercentageOfNodesToScore; n > 0 {
		fmt.Fprintf(w, "- Nodes examined per pod: `percentageOfNodesToScore: %d` patched in the config copy, every scenario: kube-scheduler stops filtering a pod "+
			"once it has found %d %% of the nodes feasible, and at least 100.\n\n", n, n)
	} else {
		fmt.Fprintf(w, "- Nodes examined per pod: the configuration leaves `percentageOfNodesToScore` unset, so kube-scheduler stops filtering a pod "+
			"once it has found 50 %% minus 1 %% per 125 nodes of the nodes feasible, and at least 100 (100 nodes: all; 500: 230; 1000: 420).\n\n")
	}
	fmt.Fprintf(w, "Measures: **pods/s** = pods ÷ (last pod seen bound by a watch − first create request; the watch is of bound pods only (field selector `spec.nodeName!=`) and of their metadata only, and it and the creators speak protobuf, as kube-scheduler's client does, so that measuring costs the process little and about the same for a CPU pod as for a GPU pod); "+
		"**latency** = from a pod's create request to its binding seen by the watch; "+
		"**writes/pod** = the scheduler's writes (audit log at the API server, user `%s`, successful writes only, events excluded and listed apart) ÷ pods bound; **refused write attempts** = the scheduler's writes the server answered with an error (a Binding whose request failed under load, though it may have been applied), not in writes/pod; "+
		"**stand-in writes** = the stand-in device plugin's successful writes; "+
		"**CPU per pod** = the whole process's CPU time (user and system, getrusage) from the first create to the last pod seen bound, ÷ pods bound: what a pod costs the process, all its parts together (the process is CPU bound at QPS 5000: its 2 cores are busy 197–198 %% of the span in the CPU profiles); the median over the rounds (each round's in brackets), which need not be the median round's by pods/s; "+
		"**the scheduler's CPU per pod** = the part of it spent by the scheduler's goroutines (in (h) and (i) the binder's, in (e) with the extender's), "+
		"read from a CPU profile of each scenario (a sample per 10 ms of CPU: a few hundred of them per scenario, so about ±6 %% from sampling alone) as the samples of the goroutines it started, which carry its pprof labels: "+
		"its scheduling and binding, informers, event recording, its clients' encoding and decoding, and the garbage collection charged to its allocations; "+
		"not the API server's, etcd's or the harness's work, nor the runtime's background collection: in a cluster, where the scheduler has cores of its own and the API server others, this is what bounds its rate; "+
		"**peak RSS** = VmHWM of /proc/self/status of the whole process (etcd, API server, scheduler and harness together), "+
		"reset before each scenario's pods are created (`echo 5 > /proc/self/clear_refs`)%s. klog verbosity 0, logs to a file.\n\n",
		cluster.UserScheduler, rssNote(r))

	nodes := r.nodes()
	for _, q := range r.Config.QPS {
		fmt.Fprintf(w, "## Client QPS %s\n\n", q)
		fmt.Fprintf(w, "| nodes | scenario | pods bound | span | pods/s | ratio to (a) | each round's pods/s (ratio to (a)'s) | CPU per pod | the scheduler's CPU per pod | p50 | p99 | scheduler writes/pod | refused write attempts | events | stand-in writes | peak RSS |\n")
		fmt.Fprintf(w, "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, n := range nodes {
			a := r.find(n, q, "a")
			for _, sc := range Scenarios {
				x := r.find(n, q, sc.Key)
				if x == nil {
					continue
				}
				ratio := "—"
				if sc.Key != "a" && a != nil && a.PodsPerSec > 0 {
					ratio = fmt.Sprintf("%.2f", x.PodsPerSec/a.PodsPerSec)
				}
				boundCell := fmt.Sprintf("%d/%d", x.Bound, x.Pods)
				if x.Incomplete {
					boundCell = "**" + boundCell + " (timeout)**"
				}
				fmt.Fprintf(w, "| %d | (%s) %s | %s | %.1f s | %.1f | %s | %s | %s | %s | %s | %s | %.2f (%s) | %d (%s) | %d | %d | %d MiB |\n",
					n, sc.Key, sc.Name, boundCell, x.Span.Seconds(), x.PodsPerSec, ratio, r.roundRates(n, q, sc.Key),
					r.cpuCell(n, q, sc.Key, (*Result).CPUPerPod), r.cpuCell(n, q, sc.Key, (*Result).SchedulerCPUPerPod), ms(x.P50), ms(x.P99),
					float64(x.WritesTotal)/float64(max(x.Bound, 1)), writesBreakdown(x.Writes), x.RefusedTotal, writesBreakdown(x.Refused), x.Events, x.StandInWrites, x.PeakRSSKiB/1024)
			}
		}
		fmt.Fprintln(w)
	}
	r.writeBatching(w, nodes)
	fmt.Fprintf(w, "A scenario marked *timeout* did not bind every pod within %s of its first create: its span ends at the timeout, "+
		"its pods/s is the pods bound over that span, and its latencies are of the bound pods only.\n\n", r.timeout())
	fmt.Fprintf(w, "## Ratios\n\nOf the median rounds; **(b)/(a) by round** is the median of the rounds' own ratios (each round's (b) over the same round's (a)), their range, and how many are 1 or more.\n\n"+
		"| nodes | QPS | (b)/(a) | (b)/(a) by round | (c)/(a) | (d)/(a) | (b)/(d) | (e)/(a) | (b)/(e) | (f)/(a) | (g)/(a) | (b)/(g) |\n|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	ratio := func(x, y *Result) string {
		if x == nil || y == nil || y.PodsPerSec == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", x.PodsPerSec/y.PodsPerSec)
	}
	for _, n := range nodes {
		for _, q := range r.Config.QPS {
			a, b, c, d, e := r.find(n, q, "a"), r.find(n, q, "b"), r.find(n, q, "c"), r.find(n, q, "d"), r.find(n, q, "e")
			f, g := r.find(n, q, "f"), r.find(n, q, "g")
			fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n, q, ratio(b, a), r.roundRatios(n, q, "b"), ratio(c, a), ratio(d, a), ratio(b, d), ratio(e, a), ratio(b, e), ratio(f, a), ratio(g, a), ratio(b, g))
		}
	}
	r.writeSchedulerCPU(w, nodes)
	r.writeFloor(w, nodes)
	r.writeMixed(w)
	fmt.Fprintf(w, "\nPeak RSS of the whole run (VmHWM, largest seen): %d MiB.\n\n", r.PeakRSSKiB/1024)
	if r.Config.CPUProfile != "" {
		fmt.Fprintf(w, "## CPU profile\n\n")
		fmt.Fprintf(w, "`runtime/pprof` CPU profile of the whole process during %s, from the first create to the last bound; "+
			"saved as `%s`. `go tool pprof -top`, flat then cumulative (the profile carries its symbols):\n\n```\n%s```\n",
			r.ProfileLabel, r.Config.CPUProfile, strings.TrimLeft(r.ProfileTop, "\n"))
	}
}

func (r *Report) timeout() string {
	if r.Config.Timeout > 0 {
		return r.Config.Timeout.String()
	}
	return "5 min + 100 ms per pod"
}

func (r *Report) nodes() []int {
	var out []int
	for _, x := range r.Results {
		if !x.Scenario.Mixed && !slices.Contains(out, x.Nodes) {
			out = append(out, x.Nodes)
		}
	}
	sort.Ints(out)
	return out
}

func qpsList(qs []QPS) string {
	var s []string
	for _, q := range qs {
		s = append(s, fmt.Sprintf("qps %g / burst %d", q.QPS, q.Burst))
	}
	return strings.Join(s, "; ")
}

func rssNote(r *Report) string {
	for _, x := range r.Results {
		if !x.ResetRSS {
			return " — the reset was refused here, so a scenario's figure is the peak since the process started"
		}
	}
	return ""
}

// roundsNote says how many rounds each QPS ran and which one a row gives.
func roundsNote(cfg Config) string {
	var parts []string
	for qi, q := range cfg.QPS {
		parts = append(parts, fmt.Sprintf("%d at QPS %s", cfg.rounds(qi), q))
	}
	return "rounds: " + strings.Join(parts, ", ") + "; each round starts one scenario later in that order (the second round at the second scenario, and so on), " +
		"and a scenario's row (and the ratios, the batching counters) is its median round by pods/s"
}

// writesBreakdown is "verb resource: n" for each kind of write, sorted.
func writesBreakdown(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func orderList(cfg Config) string {
	var keys []string
	for _, sc := range cfg.scenarios() {
		keys = append(keys, "("+sc.Key+")")
	}
	return strings.Join(keys, ", ")
}

// writeBatching is the table of kube-scheduler's batching counters per scenario.
func (r *Report) writeBatching(w io.Writer, nodes []int) {
	fmt.Fprintf(w, "## Batching\n\nkube-scheduler's own counters of the profile over each scenario (`scheduler_batch_attempts_total` by result, "+
		"`scheduler_batch_cache_flushed_total` by reason, `scheduler_batch_rescore_attempts_total`, 1.37 and later), read from the process's registry: "+
		"**hint used** = pods bound to the hinted node without a pass over the other nodes, as a share of the pods bound.\n\n")
	fmt.Fprintf(w, "| nodes | QPS | scenario | hint used | share | no hint | hint not used | batches flushed (reason) | re-scores |\n|---:|---|---|---:|---:|---:|---:|---|---:|\n")
	for _, q := range r.Config.QPS {
		for _, n := range nodes {
			for _, sc := range Scenarios {
				x := r.find(n, q, sc.Key)
				if x == nil {
					continue
				}
				b := x.Batch
				fmt.Fprintf(w, "| %d | %s | (%s) | %.0f | %.2f | %.0f | %.0f | %s | %.0f |\n", n, q, sc.Key, b.hintUsed(), b.hintUsed()/float64(max(x.Bound, 1)),
					b["attempts no_hint"], b["attempts hint_not_used"], b.flushes(), b["rescores"])
			}
		}
	}
	fmt.Fprintln(w)
}

// writeMixed is the mixed cluster's section, if it ran.
func (r *Report) writeMixed(w io.Writer) {
	m := r.Config.Mixed
	var gpu, cpu *Result
	for i := range r.Results {
		switch r.Results[i].Scenario.Key {
		case MixedGPU.Key:
			gpu = &r.Results[i]
		case MixedCPU.Key:
			cpu = &r.Results[i]
		}
	}
	if gpu == nil || cpu == nil {
		return
	}
	fmt.Fprintf(w, "\n## Mixed cluster\n\n%d nodes, %d of them GPU nodes as above and the others CPU nodes (no inventory, no `nvidia.com/gpu`), on a control plane of its own, its nodes created in %.0f s. "+
		"At client QPS %s, %d GPU pods for `%s` (the shipped configuration) and %d CPU pods for `%s` are created side by side (alternately, by the same %d clients). "+
		"`%s` is a second kube-scheduler in the same process (`test/cluster.StartSchedulerBeside`) with kube-scheduler's default profile, as (a), "+
		"and the same client QPS, as a cluster's CPU pods are scheduled by its default scheduler; it writes as the admin user, so the writes counted are dynamig-scheduler's. "+
		"Each class's pods/s is its pods over its own span (its first create to its last pod seen bound).\n\n",
		m.Nodes, m.GPUNodes, r.MixedSetup.Seconds(), gpu.QPS, gpu.Pods, SchedulerName, cpu.Pods, DefaultSchedulerName, r.Config.CreateWorkers, DefaultSchedulerName)
	fmt.Fprintf(w, "| pods | bound | span | pods/s | p50 | p99 | hints used (share) | batches flushed (reason) |\n|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, x := range []*Result{gpu, cpu} {
		fmt.Fprintf(w, "| (%s) %s | %d/%d | %.1f s | %.1f | %s | %s | %.0f (%.2f) | %s |\n", x.Scenario.Key, x.Scenario.Name, x.Bound, x.Pods, x.Span.Seconds(), x.PodsPerSec,
			ms(x.P50), ms(x.P99), x.Batch.hintUsed(), x.Batch.hintUsed()/float64(max(x.Bound, 1)), x.Batch.flushes())
	}
	ratio := "—"
	if cpu.PodsPerSec > 0 {
		ratio = fmt.Sprintf("%.2f", gpu.PodsPerSec/cpu.PodsPerSec)
	}
	fmt.Fprintf(w, "\nGPU pods' rate over CPU pods' rate: %s. dynamig-scheduler's writes: %.2f per GPU pod (%s).\n",
		ratio, float64(gpu.WritesTotal)/float64(max(gpu.Bound, 1)), writesBreakdown(gpu.Writes))
}

// ran reports whether scenario key ran.
func (r *Report) ran(key string) bool {
	return slices.ContainsFunc(r.Results, func(x Result) bool { return x.Scenario.Key == key })
}

// floorSetup describes the floor scenarios (h) and (i) when they ran.
func (r *Report) floorSetup() string {
	if !r.ran("h") && !r.ran("i") {
		return ""
	}
	return " (h) and (i), the floor: no scheduler runs; the harness's binder (`test/bench/throughput/binder.go`, as the scheduler's user, " +
		"the scheduler's client QPS) receives the pods as kube-scheduler does (a protobuf pod informer, terminal pods left out) and binds each unbound one " +
		"to the next node in turn, deciding nothing and writing no event; (h) CPU pods with a plain Binding, (i) GPU pods with a Binding that carries " +
		"what DynamicMIG's carries (a 1g.5gb reservation on one of the node's GPUs, the node, bind time and phase, a signature of the same length, computed once). " +
		"What a pod costs the process there is what any scheduler of that pod makes it spend at least (the create, the watch events, the Binding, etcd): " +
		"(i)−(h) is what the GPU pod's bigger objects cost the API server, etcd and the watches, and (a)−(h), (b)−(i) what each scheduler adds to its pods' floor."
}

// writeSchedulerCPU compares what the schedulers themselves spend per pod, (b)'s against (a)'s.
func (r *Report) writeSchedulerCPU(w io.Writer, nodes []int) {
	if !r.ran("a") || !r.ran("b") {
		return
	}
	fmt.Fprintf(w, "\n## The scheduler's own CPU per pod\n\n"+
		"The scheduler's CPU per pod (the table above: its goroutines' samples in the CPU profile), the median over the rounds, in ms: "+
		"kube-scheduler's default profile on a CPU pod (a) against dynamig-scheduler on a GPU pod (b). pods/s above also counts the API server's, etcd's and the harness's work "+
		"on the same 2 cores, where a GPU pod's bigger objects cost more (the floor, when run); this is the scheduler's part alone.\n\n")
	fmt.Fprintf(w, "| nodes | QPS | (a) | (b) | (b)/(a) | (b)/(a) by round |\n|---:|---|---:|---:|---:|---|\n")
	for _, q := range r.Config.QPS {
		for _, n := range nodes {
			a, _ := r.cpuPerPod(n, q, "a", (*Result).SchedulerCPUPerPod)
			b, _ := r.cpuPerPod(n, q, "b", (*Result).SchedulerCPUPerPod)
			if a == 0 || b == 0 {
				continue
			}
			var each []string
			for _, x := range r.ratiosByRound(n, q, "b", func(x *Result) float64 { return float64(x.SchedulerCPUPerPod()) }) {
				each = append(each, fmt.Sprintf("%.2f", x))
			}
			fmt.Fprintf(w, "| %d | %s | %.3f | %.3f | %.2f | %s |\n", n, q, millis(a), millis(b), float64(b)/float64(a), strings.Join(each, ", "))
		}
	}
}

// writeFloor is the floor section: each pod's CPU cost against its floor, when (h) and (i) ran.
func (r *Report) writeFloor(w io.Writer, nodes []int) {
	if !r.ran("h") || !r.ran("i") {
		return
	}
	fmt.Fprintf(w, "\n## What a scheduler adds to its pods' floor\n\n"+
		"CPU per pod, the median over the rounds (table above), in ms; (a)−(h) and (b)−(i) are what kube-scheduler's default profile adds to a CPU pod and dynamig-scheduler to a GPU pod "+
		"(scheduling, its informers, its events, its Binding's client side, the garbage they make), (i)−(h) what the GPU pod's bigger objects add at the floor. "+
		"(b)/(a) ≥ 1 needs (b)−(i) ≤ (a)−(h) − ((i)−(h)): dynamig-scheduler must add less to a GPU pod than the default profile adds to a CPU pod, by what the GPU pod's objects cost more. "+
		"(i)/(a) is the most any scheduler of these GPU pods could reach against (a) here, adding nothing.\n\n")
	fmt.Fprintf(w, "| nodes | QPS | (a) | (h) | (a)−(h) | (b) | (i) | (b)−(i) | (i)−(h) | (h) pods/s | (i) pods/s | (i)/(h) | (i)/(a) | (b)/(a) |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, q := range r.Config.QPS {
		for _, n := range nodes {
			a, b, h, i := r.find(n, q, "a"), r.find(n, q, "b"), r.find(n, q, "h"), r.find(n, q, "i")
			if a == nil || b == nil || h == nil || i == nil {
				continue
			}
			cpu := func(key string) float64 {
				median, _ := r.cpuPerPod(n, q, key, (*Result).CPUPerPod)
				return millis(median)
			}
			ca, cb, ch, ci := cpu("a"), cpu("b"), cpu("h"), cpu("i")
			fmt.Fprintf(w, "| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f | %.2f | %.2f | %.2f |\n", n, q,
				ca, ch, ca-ch, cb, ci, cb-ci, ci-ch, h.PodsPerSec, i.PodsPerSec, i.PodsPerSec/h.PodsPerSec, i.PodsPerSec/a.PodsPerSec, b.PodsPerSec/a.PodsPerSec)
		}
	}
}

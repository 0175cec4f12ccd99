package packing

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/gonum/stat/distuv"
)

// Machine describes where the benchmark ran, for the report.
type Machine struct {
	Cores            int
	CPU, Command, At string
}

const citation = `Traces: Alibaba cluster-trace-gpu-v2023 (alibaba/clusterdata, folder cluster-trace-gpu-v2023/csv, commit 7a6c496e), CC BY 4.0 — Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC 2023, and the alibaba/clusterdata repository.`

// figure is one figure of a run of type R: its name, how to read it, which way is better.
type figure[R any] struct {
	name   string
	of     func(R) float64
	higher bool
	// share: a share of the slots, shown in percent and compared in percentage points.
	share bool
}

// paired compares dynamig's runs (runs[0]) with baseline bi's on the figure.
func (f figure[R]) paired(runs [][]R, bi int) Paired {
	return pair(values(runs[0], f.of), values(runs[bi], f.of), f.higher)
}

// format writes a paired difference in the figure's unit.
func (f figure[R]) format(p Paired) string {
	if f.share {
		return points(p)
	}
	return fmt.Sprintf("%+.3g ± %.2g (%d/%d/%d)", p.Mean, p.SE, p.Win, p.Tie, p.Loss)
}

// writePaired writes the table of dynamig − each baseline on every figure.
func writePaired[R any](w io.Writer, policies []string, runs [][]R, figs []figure[R]) {
	fmt.Fprintf(w, "| baseline |")
	for _, f := range figs {
		fmt.Fprintf(w, " %s |", f.name)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---:|", len(figs)))
	for bi := 1; bi < len(policies); bi++ {
		fmt.Fprintf(w, "| %s |", policies[bi])
		for _, f := range figs {
			fmt.Fprintf(w, " %s |", f.format(f.paired(runs, bi)))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
}

// writeMeans writes the table of each policy's mean ± standard deviation on every figure.
func writeMeans[R any](w io.Writer, policies []string, runs [][]R, figs []figure[R]) {
	fmt.Fprintf(w, "| policy |")
	for _, f := range figs {
		fmt.Fprintf(w, " %s |", f.name)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---:|", len(figs)))
	for pi, name := range policies {
		fmt.Fprintf(w, "| %s |", name)
		for _, f := range figs {
			m, sd := meanSD(values(runs[pi], f.of))
			if f.share {
				fmt.Fprintf(w, " %s ± %.2f |", pct(m), 100*sd)
			} else {
				fmt.Fprintf(w, " %.3g ± %.2g |", m, sd)
			}
		}
		fmt.Fprintln(w)
	}
}

// comparisons pairs dynamig with every baseline on every figure of one panel.
func comparisons[R any](section, panel string, policies []string, runs [][]R, figs []figure[R]) []Comparison {
	var out []Comparison
	for _, f := range figs {
		for bi := 1; bi < len(policies); bi++ {
			out = append(out, Comparison{section, panel, f.name, policies[bi], f.paired(runs, bi)})
		}
	}
	return out
}

// The figures the report's statements single out.
var (
	figAllocated100 = figure[InflationRun]{"allocated at 100 % offered", func(r InflationRun) float64 { return r.At100 }, true, true}
	figUtilArrivals = figure[QueueOutcome]{"utilisation while pending, arrivals", func(o QueueOutcome) float64 { return o.UtilArrivals }, true, true}
	figUtilDrain    = figure[QueueOutcome]{"utilisation while pending, drain", func(o QueueOutcome) float64 { return o.UtilDrain }, true, true}
	figMeanWait     = figure[QueueOutcome]{"mean wait", func(o QueueOutcome) float64 { return o.MeanWait }, false, false}
	figQueueAtLast  = figure[QueueOutcome]{"queue at last arrival", func(o QueueOutcome) float64 { return float64(o.PendingAtLast) }, false, false}
)

var inflationFigures = []figure[InflationRun]{
	figAllocated100,
	{"allocated at 130 % offered", func(r InflationRun) float64 { return r.At130 }, true, true},
	{"fill at first refusal", func(r InflationRun) float64 { return r.FirstRefusal }, true, true},
	{"stranded at 130 %", func(r InflationRun) float64 { return r.Stranded }, false, true},
}

var queueFigures = []figure[QueueOutcome]{
	figUtilArrivals,
	figUtilDrain,
	figMeanWait,
	{"p95 wait", func(o QueueOutcome) float64 { return o.P95Wait }, false, false},
	figQueueAtLast,
	{"drain length", func(o QueueOutcome) float64 { return o.DrainTime }, false, false},
}

// drainFollowsQueue counts, over every queueing panel and pair of policies whose mean queue
// at the last arrival differs, the pairs where the longer queue also had the higher mean
// utilisation while pending in the drain: that figure rises with the work left waiting, so
// a policy that has served more by the last arrival shows less of it.
func (r *Report) drainFollowsQueue() (concordant, pairs int) {
	for _, p := range r.Queue {
		queue := make([]float64, len(p.Runs))
		drain := make([]float64, len(p.Runs))
		for pi, runs := range p.Runs {
			queue[pi], _ = meanSD(values(runs, figQueueAtLast.of))
			drain[pi], _ = meanSD(values(runs, figUtilDrain.of))
		}
		for i := range queue {
			for j := i + 1; j < len(queue); j++ {
				if queue[i] == queue[j] || math.IsNaN(drain[i]) || math.IsNaN(drain[j]) {
					continue
				}
				pairs++
				if (queue[i] > queue[j]) == (drain[i] > drain[j]) {
					concordant++
				}
			}
		}
	}
	return concordant, pairs
}

// values reads one figure from each run.
func values[R any](runs []R, of func(R) float64) []float64 {
	out := make([]float64, len(runs))
	for i, r := range runs {
		out[i] = of(r)
	}
	return out
}

// Comparison is dynamig paired with one baseline on one figure of one panel.
type Comparison struct {
	Section, Panel, Figure, Baseline string
	Paired                           Paired
}

// Comparisons lists every paired inflation-fill and queueing comparison.
func (r *Report) Comparisons() []Comparison {
	var out []Comparison
	for _, p := range r.Inflation {
		out = append(out, comparisons("inflation fill", fmt.Sprintf("%s on %d × %s", p.Workload, p.GPUs, p.Cluster), r.Policies, p.Runs, inflationFigures)...)
	}
	for _, p := range r.Queue {
		out = append(out, comparisons("queueing replay", fmt.Sprintf("%s on %d × %s", p.Workload, p.GPUs, p.Cluster), r.Policies, p.Runs, queueFigures)...)
	}
	return out
}

// shortfalls lists the comparisons where dynamig is worse than the baseline by more than
// the standard error.
func shortfalls(cs []Comparison) []Comparison {
	var out []Comparison
	for _, c := range cs {
		if c.Paired.Worse() {
			out = append(out, c)
		}
	}
	return out
}

// byChance is, over the comparisons whose differences vary (SE > 0), how many there are
// and how many of them would show dynamig worse by more than k standard errors if it and
// the baseline were equal: the mean difference over SE follows Student's t with N−1
// degrees of freedom, which is below −k with probability T(−k).
func byChance(cs []Comparison, k float64) (n int, expected float64) {
	for _, c := range cs {
		if c.Paired.SE <= 0 || c.Paired.N < 2 {
			continue
		}
		n++
		expected += distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(c.Paired.N - 1)}.CDF(-k)
	}
	return n, expected
}

func pct(x float64) string { return fmt.Sprintf("%.1f %%", 100*x) }

// points is a difference of shares in percentage points with its standard error.
func points(p Paired) string {
	return fmt.Sprintf("%+.2f ± %.2f (%d/%d/%d)", 100*p.Mean, 100*p.SE, p.Win, p.Tie, p.Loss)
}

// WriteMarkdown writes docs/benchmarks/packing.md.
func (r *Report) WriteMarkdown(w io.Writer, m Machine) {
	fmt.Fprintf(w, "# Packing benchmark (placement quality)\n\n")
	fmt.Fprintf(w, "Generated by `%s` on %s; %d cores (%s).\n\n", m.Command, m.At, m.Cores, m.CPU)
	fmt.Fprintf(w, "%s\n\n", citation)
	r.writeSummary(w)
	r.writeMethod(w)
	r.writeInflation(w)
	r.writeQueue(w)
	r.writeStatic(w)
	r.writeDrop(w)
}

// writeSummary states what holds, in figures with their uncertainty: per workload, what
// dynamig allocates when the demand offered equals the cluster, against the bounds and
// each baseline, and how it queues.
func (r *Report) writeSummary(w io.Writer) {
	fmt.Fprintf(w, "## What holds\n\n")
	r.writeStatements(w)
	if len(r.Inflation) > 0 {
		fmt.Fprintf(w, "Filling an empty cluster of %d GPUs with no departures (inflation fill, %d orders of pods, paired): the share of slots dynamig has allocated once the pods offered add up to the cluster's slots, the bounds, and dynamig − each baseline in percentage points ± standard error (wins/ties/losses over the orders).\n\n",
			r.Config.FillGPUs, r.Config.Orders+1)
		fmt.Fprintf(w, "| workload | model | dynamig | ÷ capacity bound | per-GPU packing bound |")
		for _, b := range r.Policies[1:] {
			fmt.Fprintf(w, " vs %s |", b)
		}
		fmt.Fprintf(w, "\n|---|---|---:|---:|---:|%s\n", strings.Repeat("---:|", len(r.Policies)-1))
		for _, p := range r.Inflation {
			at100 := values(p.Runs[0], figAllocated100.of)
			m, _ := meanSD(at100)
			ratio := make([]float64, len(at100))
			for i := range at100 {
				ratio[i] = at100[i] / p.Capacity100[i]
			}
			rm, _ := meanSD(ratio)
			k, _ := meanSD(p.Packing100)
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s |", p.Workload, p.Cluster, pct(m), pct(rm), pct(k))
			for bi := 1; bi < len(r.Policies); bi++ {
				fmt.Fprintf(w, " %s |", points(pair(at100, values(p.Runs[bi], figAllocated100.of), true)))
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w)
	}
	if len(r.Queue) > 0 {
		fmt.Fprintf(w, "Pods waiting for room (queueing replay at offered load %.2f, paired replays): the share of slots dynamig keeps in use while pods wait and arrivals still come, and its mean wait against each baseline's (ratio of the means).\n\n", r.Config.QueueLoad)
		fmt.Fprintf(w, "| workload | cluster | dynamig in use while pending | mean wait |")
		for _, b := range r.Policies[1:] {
			fmt.Fprintf(w, " ÷ %s |", b)
		}
		fmt.Fprintf(w, "\n|---|---|---:|---:|%s\n", strings.Repeat("---:|", len(r.Policies)-1))
		for _, p := range r.Queue {
			u, _ := meanSD(values(p.Runs[0], figUtilArrivals.of))
			dw, _ := meanSD(values(p.Runs[0], figMeanWait.of))
			fmt.Fprintf(w, "| %s | %d × %s | %s | %.3g %s |", p.Workload, p.GPUs, p.Cluster, pct(u), dw, p.TimeUnit)
			for bi := 1; bi < len(r.Policies); bi++ {
				bw, _ := meanSD(values(p.Runs[bi], figMeanWait.of))
				fmt.Fprintf(w, " %.3f |", dw/bw)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w)
	}
	r.writeRelocationSummary(w)
	all := r.Comparisons()
	short := shortfalls(all)
	if len(short) == 0 {
		fmt.Fprintf(w, "On every paired inflation-fill and queueing figure below, dynamig is at least as good as every baseline within one standard error.\n\n")
	} else {
		fmt.Fprintf(w, "Paired figures below where dynamig is worse than a baseline by more than one standard error (%d):\n\n", len(short))
		n, one := byChance(all, 1)
		_, two := byChance(all, 2)
		beyondTwo := 0
		for _, c := range short {
			if c.Paired.WorseBy(2) {
				beyondTwo++
			}
		}
		fmt.Fprintf(w, "Of the %d paired comparisons whose differences vary, about %.0f would show dynamig worse by more than one standard error by chance alone were it equal to every baseline (%.0f beyond two; Student's t, N − 1 degrees of freedom); %d are, %d of them beyond two.\n\n", n, one, two, len(short), beyondTwo)
		if c, n := r.drainFollowsQueue(); n > 0 {
			fmt.Fprintf(w, "*Utilisation while pending, drain* rises with the queue a policy has left at the last arrival (more waiting pods fill more of the room that departures free): of the %d pairs of policies whose mean queues differ, the one with the longer queue has the higher drain utilisation in %d. It is reported as measured, but a policy that has served more pods by then shows less of it.\n\n", n, c)
		}
		// A drain shortfall is shown with the same pair's queue at the last arrival and mean
		// wait, the figures it follows.
		same := map[[4]string]Paired{}
		for _, c := range all {
			same[[4]string{c.Section, c.Panel, c.Figure, c.Baseline}] = c.Paired
		}
		for _, s := range short {
			fmt.Fprintf(w, "- %s, %s, %s vs %s: %+.4f ± %.4f (%d/%d/%d)", s.Section, s.Panel, s.Figure, s.Baseline, s.Paired.Mean, s.Paired.SE, s.Paired.Win, s.Paired.Tie, s.Paired.Loss)
			if s.Figure == figUtilDrain.name {
				q := same[[4]string{s.Section, s.Panel, figQueueAtLast.name, s.Baseline}]
				m := same[[4]string{s.Section, s.Panel, figMeanWait.name, s.Baseline}]
				fmt.Fprintf(w, "; queue at last arrival %+.3g ± %.2g, mean wait %+.3g ± %.2g", q.Mean, q.SE, m.Mean, m.SE)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w)
	}
}

// writeStatements says in words, per workload, what the inflation fill and the queueing
// replay show: how much more of the cluster dynamig fills than the best and the worst
// baseline when demand equals capacity (mean over models, the largest standard error), and
// how its mean wait compares.
func (r *Report) writeStatements(w io.Writer) {
	for _, wl := range r.Workloads {
		var lead = map[string][]Paired{}
		var capRatio []float64
		for _, p := range r.Inflation {
			if p.Workload != wl.Name {
				continue
			}
			at100 := values(p.Runs[0], figAllocated100.of)
			for i := range at100 {
				capRatio = append(capRatio, at100[i]/p.Capacity100[i])
			}
			for bi := 1; bi < len(r.Policies); bi++ {
				lead[r.Policies[bi]] = append(lead[r.Policies[bi]], figAllocated100.paired(p.Runs, bi))
			}
		}
		if len(capRatio) == 0 {
			continue
		}
		cm, _ := meanSD(capRatio)
		var parts []string
		for _, b := range r.Policies[1:] {
			m, se := 0.0, 0.0
			for _, p := range lead[b] {
				m += p.Mean / float64(len(lead[b]))
				se = max(se, p.SE)
			}
			parts = append(parts, fmt.Sprintf("%+.1f ± %.1f points (%.1f GPUs of %d) over %s", 100*m, 100*se, m*float64(r.Config.FillGPUs), r.Config.FillGPUs, b))
		}
		var waits []float64
		for _, p := range r.Queue {
			if p.Workload != wl.Name {
				continue
			}
			dw, _ := meanSD(values(p.Runs[0], figMeanWait.of))
			for bi := 1; bi < len(r.Policies); bi++ {
				bw, _ := meanSD(values(p.Runs[bi], figMeanWait.of))
				waits = append(waits, dw/bw)
			}
		}
		queue := ""
		if len(waits) > 0 {
			queue = fmt.Sprintf(" When pods queue, its mean wait is %.2f–%.2f of the baselines'.", slices.Min(waits), slices.Max(waits))
		}
		fmt.Fprintf(w, "- **%s** (%s): when the pods offered equal the cluster's slots, dynamig has placed %s of what the capacity bound allows, %s.%s\n",
			wl.Name, wl.Describe(), pct(cm), strings.Join(parts, ", "), queue)
	}
	fmt.Fprintf(w, "\nPlacement matters most where pods are small and many share a GPU, or need whole GPUs together; on the Alibaba traces, whose pods mostly take half a GPU or more, every policy fills the cluster within about a point of the others.\n\n")
}

func (r *Report) writeMethod(w io.Writer) {
	fmt.Fprintf(w, "## Workloads, policies and method\n\n")
	fmt.Fprintf(w, "Workloads:\n\n")
	for _, wl := range r.Workloads {
		fmt.Fprintf(w, "- **%s**: %s.\n", wl.Name, wl.Describe())
	}
	fmt.Fprintf(w, `
- Trace pods are those with num_gpu ≥ 1 and deletion after creation. The trace has no MIG sizes: a pod with one GPU and gpu_milli < 1000 asks for one device of ceil(gpu_milli/1000 × the full-GPU profile's memory) MiB of the model; the others ask for num_gpu whole devices (the full-GPU profile). On these models 90–96 %% of trace pods need a 3g instance or more.
- A generated pod asks for the memory of the smallest default-allowlist profile with its slice count (7g: the whole GPU).
- Clusters: GPUs of one model, %d to a node, each node's inventory published by the device plugin's own inventory code over simulated GPUs, with the default allowlist (A100-40GB and H100-80GB: 1g, 2g, 3g, 7g). A pod's size in slots is its devices × the slots of the smallest profile that holds one; every share below counts placed pods at that size (a device given a larger instance counts no more).

Policies:

- **dynamig** — placement.Fit on every node with the shipped options (MIG binpack, fragmentation-aware) and the scheduler plugin's node order (placement.NodeScore and NormalizeScores): the fit of lowest fragmentation cost, then a node with a GPU in use over an empty one, then the lowest node index (the plugin: the first node by name), i.e. first fit in a fixed node order rather than the fullest node. **dynamig-no-frag** — the same with fragmentation cost off, in the node order and on the GPU.
- **hami-v2.10** — HAMi v2.10's MIG placement with its defaults (node binpack by HAMi's node score before the pod, ties to the lowest node index where HAMi is effectively random; GPU spread, ties to the highest index; a pod's devices on one GPU until it is full; profiles by memory then slices, larger ones on the same GPU before the next GPU; placements descending for 1g/3g, ascending otherwise; only instances < Count), written in the benchmark from HAMi's documented behaviour. A whole-device pod asks it for the full-GPU profile's memory explicitly: with HAMi's own default (100%% of the card's memory) it would fit no MIG GPU at all.
- **hami-main** — HAMi's placement after its pull request 2855 (merged August 2026), **written from that pull request's description, not from HAMi's code**: node and GPU order as v2.10; within a GPU the requests with the fewest legal placements first; each device at the free placement of v2.10's profile that leaves the largest contiguous run of free slots, then the most placements of the GPU's profiles still possible; when that greedy pass does not place every device the GPU is asked for, a backtracking search over every free placement of every large-enough profile.
- **first-fit** — first GPU in order that fits, smallest profile, lowest free start.

Every comparison is **paired**: each policy gets the very same pods in the very same order (inflation fill) or the very same arrivals (queueing replay); a difference is reported as the mean of the per-input differences (dynamig − baseline) ± its standard error, with dynamig's wins/ties/losses.

`, GPUsPerNode)
}

func (r *Report) writeInflation(w io.Writer) {
	if len(r.Inflation) == 0 {
		return
	}
	cfg := r.Config
	fmt.Fprintf(w, "## Inflation fill\n\n")
	fmt.Fprintf(w, "Pods are offered one by one to an empty cluster of %d GPUs with no departures (Weng et al., ATC'23); a pod that does not fit is skipped and the next is offered, until the pods offered add up to %.0f %% of the cluster's slots. "+
		"Orders: the trace in file order plus %d shuffles (generated mixes: %d seeds), the same for every policy. Pods no empty node holds are not offered. Figures are shares of the cluster's slots: "+
		"*allocated at 100 %%* once every pod was offered whose running sum stays within the cluster's slots (its capacity bound is that offered share, just under 100 %%), *at 130 %%* likewise; "+
		"*fill at first refusal* is the allocated share when the first pod was turned away; *stranded* is the share of slots free at 130 %% that no free legal placement of the smallest refused pod's profile covers. "+
		"Bounds: the capacity bound (offered share, capped at 100 %%), and the per-GPU packing bound — the linear relaxation (gonum's simplex, rounded down) of the best assignment of the offered devices to legal GPU configurations (instances at legal, disjoint placements within the instance counts), ignoring node boundaries, order and the unity of a multi-device pod: no policy can beat it.\n\n",
		cfg.FillGPUs, 100*MaxOffered, cfg.Orders, cfg.Orders+1)
	for _, p := range r.Inflation {
		fmt.Fprintf(w, "### %s on %d × %s\n\n", p.Workload, p.GPUs, p.Cluster)
		writeMeans(w, r.Policies, p.Runs, inflationFigures)
		c100, _ := meanSD(p.Capacity100)
		k100, _ := meanSD(p.Packing100)
		k130, _ := meanSD(p.Packing130)
		fmt.Fprintf(w, "| *capacity bound* | %s | 100.0 %% | | |\n", pct(c100))
		fmt.Fprintf(w, "| *per-GPU packing bound* | %s | %s | | |\n\n", pct(k100), pct(k130))
		ratio := make([]float64, len(p.Runs[0]))
		for i, run := range p.Runs[0] {
			ratio[i] = run.At100 / p.Capacity100[i]
		}
		rm, rsd := meanSD(ratio)
		fmt.Fprintf(w, "dynamig at 100 %% offered: %s ± %.2f of the capacity bound.\n\n", pct(rm), 100*rsd)
		fmt.Fprintf(w, "Paired, dynamig − baseline in percentage points ± standard error (wins/ties/losses; for *stranded*, lower is better and a win is dynamig lower):\n\n")
		writePaired(w, r.Policies, p.Runs, inflationFigures)
	}
	fmt.Fprintf(w, "![inflation fill: allocated share vs offered share](packing.svg)\n\n")
}

func (r *Report) writeQueue(w io.Writer) {
	if len(r.Queue) == 0 {
		return
	}
	cfg := r.Config
	fmt.Fprintf(w, "## Queueing replay\n\n")
	fmt.Fprintf(w, "A pod that does not fit waits. After every departure the pending pods are retried in arrival order, a pod that does not fit not blocking later ones; an arrival is tried at once. "+
		"Arrivals: a trace is scaled to offered load %.2f (arrival times divided so that the mean requested slots over the arrival span equal %.2f × the cluster's slots; durations kept) and replayed %d times, replay 0 as is and the others with every arrival jittered by a uniform fraction of the mean interarrival time; "+
		"a generated mix is %d pods with Poisson arrivals at that load and exponential lifetimes, %d seeds. Every policy gets the same replays (paired). "+
		"*Utilisation while pending* is the time-averaged share of slots in use while at least one pod waits, split at the last arrival (*arrivals*: while arrivals still come; *drain*: after, when the queue empties); *queue at last arrival* counts the pods waiting then and *drain length* is how long pods wait after it (lower is better for both). "+
		"Waits are in hours of the trace's own time (durations are kept) and, for a generated mix, in mean pod lifetimes; p95 by size is per smallest profile (and device count).\n\n",
		cfg.QueueLoad, cfg.QueueLoad, cfg.QueueReplays, cfg.QueuePods, cfg.QueueReplays)
	for _, p := range r.Queue {
		var labels []string
		for _, runs := range p.Runs {
			for _, o := range runs {
				for l := range o.P95BySize {
					if !slices.Contains(labels, l) {
						labels = append(labels, l)
					}
				}
			}
		}
		slices.SortFunc(labels, compareSizeLabels)
		fmt.Fprintf(w, "### %s on %d × %s (%d pods; waits in %s)\n\n", p.Workload, p.GPUs, p.Cluster, p.Pods, p.TimeUnit)
		figs := slices.Clone(queueFigures)
		for _, l := range labels {
			figs = append(figs, figure[QueueOutcome]{name: "p95 " + l, of: func(o QueueOutcome) float64 {
				if v, ok := o.P95BySize[l]; ok {
					return v
				}
				return math.NaN()
			}})
		}
		writeMeans(w, r.Policies, p.Runs, figs)
		fmt.Fprintf(w, "\nPaired, dynamig − baseline ± standard error (wins/ties/losses; utilisation in percentage points, higher is better; waits, lower is better):\n\n")
		writePaired(w, r.Policies, p.Runs, queueFigures)
		if p.Relocating != nil {
			r.writeRelocation(w, p)
		}
	}
}

// relocationFigures are the queueing figures with what relocation cost.
var relocationFigures = append(slices.Clone(queueFigures),
	figure[QueueOutcome]{"pods relocated per 100 placed", func(o QueueOutcome) float64 { return 100 * float64(o.Relocated) / float64(o.Placed) }, false, false},
	figure[QueueOutcome]{"relocations per unit of time", func(o QueueOutcome) float64 { return o.RelocatedPerUnit }, false, false},
)

// writeRelocation writes the panel's relocation variant beside dynamig and the baselines, on
// the same replays: means, then paired differences.
func (r *Report) writeRelocation(w io.Writer, p QueuePanel) {
	name := fmt.Sprintf("dynamig, relocation on (%.0f %% relocatable)", 100*r.Config.RelocatableShare)
	names := append([]string{name}, r.Policies...)
	runs := append([][]QueueOutcome{p.Relocating}, p.Runs...)
	fmt.Fprintf(w, "\nRelocation: the same replays through dynamig with relocation on, %.0f %% of the pods relocatable (chosen by their index, the same in every replay): a pod that does not fit takes the room of the smallest set of relocatable pods on one GPU that each fit on another node now (`placement.Relocate`, as DynamicMIG's PostFilter chooses), which are placed again at once keeping their departure times (a restart costs them nothing here), each at most once; relocations per unit of time are per %s of the whole replay.\n\n", 100*r.Config.RelocatableShare, p.TimeUnit)
	writeMeans(w, names, runs, relocationFigures)
	fmt.Fprintf(w, "\nPaired, relocation − each ± standard error (wins/ties/losses):\n\n")
	writePaired(w, names, runs, queueFigures)
}

// writeRelocationSummary states, per queueing panel, what relocation changed against
// dynamig on the same replays and what it cost.
func (r *Report) writeRelocationSummary(w io.Writer) {
	if r.Config.RelocatableShare <= 0 || len(r.Queue) == 0 {
		return
	}
	figs := []figure[QueueOutcome]{figUtilArrivals, figMeanWait, queueFigures[3]}
	cost := relocationFigures[len(queueFigures):]
	fmt.Fprintf(w, "Relocation (dynamig with relocation on, %.0f %% of the pods relocatable, on the same replays): relocation − dynamig ± standard error (wins/ties/losses), and what it cost (mean over the replays).\n\n", 100*r.Config.RelocatableShare)
	fmt.Fprintf(w, "| workload | cluster |")
	for _, f := range append(figs, cost...) {
		fmt.Fprintf(w, " %s |", f.name)
	}
	fmt.Fprintf(w, "\n|---|---|%s\n", strings.Repeat("---:|", len(figs)+len(cost)))
	for _, p := range r.Queue {
		if p.Relocating == nil {
			continue
		}
		runs := [][]QueueOutcome{p.Relocating, p.Runs[0]}
		fmt.Fprintf(w, "| %s | %d × %s |", p.Workload, p.GPUs, p.Cluster)
		for _, f := range figs {
			fmt.Fprintf(w, " %s |", f.format(f.paired(runs, 1)))
		}
		for _, f := range cost {
			m, _ := meanSD(values(p.Relocating, f.of))
			fmt.Fprintf(w, " %.3g |", m)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nWaits are in each panel's unit (hours for the traces, mean lifetimes for the generated mixes), as are relocations per unit of time.\n\n")
}

// compareSizeLabels orders "1g" < "2g" < … < "2×7g" < "4×7g".
func compareSizeLabels(a, b string) int {
	key := func(s string) (int, string) {
		if n, rest, ok := strings.Cut(s, "×"); ok {
			return len(n)*100 + int(n[0]), rest
		}
		return 0, s
	}
	ka, ra := key(a)
	kb, rb := key(b)
	if ka != kb {
		return ka - kb
	}
	return strings.Compare(ra, rb)
}

func (r *Report) writeStatic(w io.Writer) {
	if len(r.Static) == 0 {
		return
	}
	cfg := r.Config
	fmt.Fprintf(w, "## Static fill vs optimal\n\n")
	fmt.Fprintf(w, "Each window starts at a trace pod (windows evenly spread over the trace) and takes the following pods one by one: "+
		"a pod joins the window when an exact search (`PlacesAll`: depth-first over every GPU, published profile, free legal placement and instance count, "+
		"memoised on the multiset of GPU states, budget %d nodes) finds an assignment placing the window with it entirely on the empty node; "+
		"otherwise it is passed over. The window ends at %d pods or after %d pods in a row passed over (the node is full for what follows). "+
		"Pods that fit no empty node (more devices than the node has GPUs) are left out. So the *optimum* of every window is all of its pods, exactly, "+
		"and a policy that places fewer, in the window's order with refused pods skipped, lost them to its placement choices alone.\n\n",
		FillBudget, cfg.StaticPods, fillMisses)
	for _, f := range r.Static {
		sum := 0
		for _, x := range f.Results {
			sum += x.Size
		}
		fmt.Fprintf(w, "### %s on %s (%d windows; mean optimum %.1f pods)\n\n", f.Workload, f.Cluster, len(f.Results), float64(sum)/float64(max(1, len(f.Results))))
		fmt.Fprintf(w, "| policy | placed / optimal (mean) | worst window | windows placed entirely |\n|---|---:|---:|---:|\n")
		for _, name := range r.Policies {
			var mean float64
			worst, full := 1.0, 0
			for _, x := range f.Results {
				ratio := 1.0
				if x.Size > 0 {
					ratio = float64(x.Placed[name]) / float64(x.Size)
				}
				mean += ratio
				worst = min(worst, ratio)
				if x.Placed[name] == x.Size {
					full++
				}
			}
			fmt.Fprintf(w, "| %s | %.3f | %.3f | %d of %d |\n", name, mean/float64(max(1, len(f.Results))), worst, full, len(f.Results))
		}
		fmt.Fprintln(w)
	}
}

func (r *Report) outcome(p *Panel, li, pi int) Outcome { return p.Outcomes[li*len(r.Policies)+pi] }

func (r *Report) writeDrop(w io.Writer) {
	if len(r.Drop) == 0 {
		return
	}
	cfg := r.Config
	fmt.Fprintf(w, "## Secondary: drop-on-arrival replay\n\n")
	fmt.Fprintf(w, "**Caveat: this replay measures the trace more than the placement.** Arrival times are divided so that the mean requested slots over the arrival span equal load × the cluster's slots; a refused pod is dropped. "+
		"In the default trace 99 %% of pods arrive in the last 22 %% of its span while its first 1 %% (70 pods running 23 days on average) carry 68 %% of the slot-time, so at a \"load\" of 2 the cluster is near full for the last fifth and idle before: "+
		"acceptance falls with load for every policy alike, the capacity-only relaxation (pooled slots, no placement rules; not a strict bound) lands within noise of them, and a time-averaged utilisation of 0.3 says nothing about packing. "+
		"Read the inflation fill and the queueing replay above for placement; this table is kept for continuity with earlier reports.\n\n")
	for i := range r.Drop {
		p := &r.Drop[i]
		fmt.Fprintf(w, "### %s on %d × %s (%d pods): acceptance ratio\n\n", p.Workload, p.GPUs, p.Cluster, p.Pods)
		fmt.Fprintf(w, "| load | %s | capacity-only |\n|---:|%s---:|\n", strings.Join(r.Policies, " | "), strings.Repeat("---:|", len(r.Policies)))
		for li, load := range cfg.DropLoads {
			fmt.Fprintf(w, "| %.2f |", load)
			for pi := range r.Policies {
				fmt.Fprintf(w, " %.4f |", r.outcome(p, li, pi).Acceptance())
			}
			fmt.Fprintf(w, " %.4f |\n", p.Capacity[li].Acceptance())
		}
		fmt.Fprintln(w)
	}
}

var colours = []string{"#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b"}

// WriteSVG plots the inflation fill: the mean allocated share against the offered share,
// one panel per workload and cluster, one line per policy, the capacity bound dashed.
func (r *Report) WriteSVG(w io.Writer) {
	const pw, ph, ml, mt, mb, mr, cols = 300, 220, 45, 30, 35, 10, 4
	rows := max(1, (len(r.Inflation)+cols-1)/cols)
	width, height := cols*(pw+ml+mr), rows*(ph+mt+mb)+30
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for pi, name := range r.Policies {
		x := 10 + pi*150
		fmt.Fprintf(w, `<line x1="%d" y1="15" x2="%d" y2="15" stroke="%s" stroke-width="2"/><text x="%d" y="19">%s</text>`+"\n", x, x+20, colours[pi%len(colours)], x+25, name)
	}
	const lo, hi = 0.5, MaxOffered // the interesting part of the curve
	for i := range r.Inflation {
		p := &r.Inflation[i]
		ox, oy := (i%cols)*(pw+ml+mr)+ml, 30+(i/cols)*(ph+mt+mb)+mt
		fmt.Fprintf(w, `<text x="%d" y="%d" font-weight="bold">%s, %d × %s</text>`+"\n", ox, oy-8, p.Workload, p.GPUs, p.Cluster)
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", ox, oy, pw, ph)
		xOf := func(x float64) float64 { return float64(ox) + (x-lo)/(hi-lo)*pw }
		yOf := func(a float64) float64 { return float64(oy) + (1-(a-lo)/(1-lo))*ph }
		for _, t := range []float64{0.5, 0.6, 0.7, 0.8, 0.9, 1} {
			fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%.1f</text>`+"\n", ox, yOf(t), ox+pw, yOf(t), ox-4, yOf(t)+4, t)
		}
		for _, t := range []float64{0.5, 0.7, 0.9, 1.1, 1.3} {
			fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%.1f</text>`+"\n", xOf(t), oy+ph+14, t)
		}
		fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="middle">offered share of slots</text>`+"\n", ox+pw/2, oy+ph+28)
		fmt.Fprintf(w, `<polyline fill="none" stroke="#777" stroke-dasharray="4 3" points="%.1f,%.1f %.1f,%.1f %.1f,%.1f"/>`+"\n", xOf(lo), yOf(lo), xOf(1), yOf(1), xOf(hi), yOf(1))
		for pi := range r.Policies {
			var pts []string
			for k := range p.Runs[pi][0].Curve {
				x := float64(k+1) * curveStep
				if x < lo-1e-9 {
					continue
				}
				m, _ := meanSD(values(p.Runs[pi], func(run InflationRun) float64 { return run.Curve[k] }))
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(x), yOf(max(m, lo))))
			}
			fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", colours[pi%len(colours)], strings.Join(pts, " "))
		}
	}
	fmt.Fprintln(w, "</svg>")
}

package burst

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Design is the hand-off design the benchmark runs: the device plugin as built.
const Design = "PreStartContainer, no Lease (the kubelet names the container; creates take turns per GPU only)"

// Baseline is a burst figure measured earlier, cited by the report as the "before".
type Baseline struct {
	Design string
	// Source is where the figure was published: a file and the commit that wrote it.
	Source string
	// Kubelet is what played the kubelet then (the report's runs use the real one).
	Kubelet string
	// Config is the burst it measured: the report compares against it only when the run's
	// Model, GPUs, Pods, MemoryMiB and CreateLatency are the same.
	Config         Config
	Runs           int
	Mean, Min, Max time.Duration
}

// LeaseBaseline is the hand-off Lease design's burst (56 one-slice pods at 8 A100-40GB,
// 1.5 s per create), before the Lease was removed: docs/benchmarks/burst.md as commit
// 53d70cc wrote it.
var LeaseBaseline = Baseline{
	Design: "the node's hand-off Lease (one pod realised at a time per node)",
	Source: "docs/benchmarks/burst.md at commit 53d70cc",
	Kubelet: "the hand-written kubelet stand-in test/kubelet (Allocate at admission, the pod Running once realised), " +
		"retired since: part of the difference may be the real kubelet's",
	Config: Config{Model: "A100-40GB", GPUs: 8, Pods: 56, MemoryMiB: 4000, CreateLatency: 1500 * time.Millisecond},
	Runs:   3, Mean: 106100 * time.Millisecond, Min: 106000 * time.Millisecond, Max: 106100 * time.Millisecond,
}

// comparable reports whether b measured the same burst as cfg.
func (b Baseline) comparable(cfg Config) bool {
	c := b.Config
	return c.Model == cfg.Model && c.GPUs == cfg.GPUs && c.Pods == cfg.Pods && c.MemoryMiB == cfg.MemoryMiB && c.CreateLatency == cfg.CreateLatency
}

// Report is the Markdown report of bursts of one Config, each on a fresh sandbox, with the
// command and machine that made it.
func Report(runs []*Result, command, cpu string, date time.Time) []byte {
	cfg := runs[0].Config
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Burst of GPU pods to one node\n\n")
	fmt.Fprintf(&b, "Command: `%s`  \nDate: %s  \nMachine: %s, %d CPUs, %s/%s\n\n", command, date.UTC().Format("2006-01-02 15:04 UTC"), cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "The whole sandbox (`test/sandbox`: embedded etcd, the real kube-apiserver, the shipped manifest `%s` applied (its RBAC, admission policies and webhook; every component as its service account), the real dynamig-scheduler, the real device plugin, the real kubelet with a fake CDI-resolving runtime from `test/kubeletnode`, its image pulls unthrottled, `registryPullQPS: 0`, as on a node that has the image: the fake pulls instantly, and the default 5 pulls/s failed a burst's pulls into 10–20 s back-offs that measured the kubelet, not the hand-off) with one `mig` node of %d × %s. Simulated NVML takes %s per GPU-instance create, one create at a time per GPU (creates on different GPUs overlap), the time HAMi's pull request 2910 reports for creating an instance. %d pods, each one MIG device of %d MiB, are created at once; the figure is from the device plugin's first GPU-instance create to the last pod seen Running with its reservation realised (`hami.io/bind-phase: success`). Each run starts a fresh sandbox.\n\n",
		cfg.Install, cfg.GPUs, cfg.Model, cfg.CreateLatency, cfg.Pods, cfg.MemoryMiB)
	perGPU := (cfg.Pods + cfg.GPUs - 1) / cfg.GPUs
	fmt.Fprintf(&b, "Bounds: one create at a time per node, %d × %s = %.1f s; creates of different GPUs overlapping, %d × %s = %.1f s.\n\n",
		cfg.Pods, cfg.CreateLatency, (time.Duration(cfg.Pods) * cfg.CreateLatency).Seconds(), perGPU, cfg.CreateLatency, (time.Duration(perGPU) * cfg.CreateLatency).Seconds())
	fmt.Fprintf(&b, "| hand-off design | run | pods Running | instances | first create → last Running |\n|---|---|---|---|---|\n")
	var elapsed []float64
	for i, res := range runs {
		var profiles []string
		for p, n := range res.Profiles {
			profiles = append(profiles, fmt.Sprintf("%d × %s", n, p))
		}
		slices.Sort(profiles)
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %.1f s |\n",
			Design, i+1, len(res.Running), strings.Join(profiles, ", "), res.Elapsed.Seconds())
		elapsed = append(elapsed, res.Elapsed.Seconds())
	}
	mean := 0.0
	for _, e := range elapsed {
		mean += e
	}
	mean /= float64(len(elapsed))
	fmt.Fprintf(&b, "\nMean **%.1f s** over %d runs (min %.1f s, max %.1f s).\n\n", mean, len(elapsed), slices.Min(elapsed), slices.Max(elapsed))
	base := LeaseBaseline
	if base.comparable(cfg) {
		fmt.Fprintf(&b, "Before: %s, the same burst, mean **%.1f s** over %d runs (min %.1f s, max %.1f s; %s; kubelet: %s). Now %.1f s: %.2f × the time, %.1f s less.\n\n",
			base.Design, base.Mean.Seconds(), base.Runs, base.Min.Seconds(), base.Max.Seconds(), base.Source, base.Kubelet, mean, mean/base.Mean.Seconds(), base.Mean.Seconds()-mean)
	} else {
		fmt.Fprintf(&b, "Before: %s measured %.1f s (%s) for a different burst (%d × %s, %d pods of %d MiB, %s per create): not compared.\n\n",
			base.Design, base.Mean.Seconds(), base.Source, base.Config.GPUs, base.Config.Model, base.Config.Pods, base.Config.MemoryMiB, base.Config.CreateLatency)
	}
	fmt.Fprintf(&b, "Pods Running in run 1, by seconds after the first create:")
	for i, t := range runs[0].Running {
		if i%8 == 0 {
			fmt.Fprintf(&b, "\n")
		}
		fmt.Fprintf(&b, " %.1f", t.Sub(runs[0].FirstCreate).Seconds())
	}
	fmt.Fprintf(&b, "\n")
	return b.Bytes()
}

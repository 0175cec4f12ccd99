package burst

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Report is the Markdown report of bursts of one Config, each on a fresh sandbox, with the
// command and machine that made it.
func Report(runs []*Result, command, cpu string, date time.Time) []byte {
	cfg := runs[0].Config
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Burst of GPU pods to one node\n\n")
	fmt.Fprintf(&b, "Command: `%s`  \nDate: %s  \nMachine: %s, %d CPUs, %s/%s\n\n", command, date.UTC().Format("2006-01-02 15:04 UTC"), cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "The whole sandbox (`test/sandbox`: embedded etcd, the real kube-apiserver, the real dynamig-scheduler from `%s`, the real device plugin with its kubelet stand-in) with one `mig` node of %d × %s. Simulated NVML takes %s per GPU-instance create, one create at a time per GPU (creates on different GPUs overlap), the time HAMi's pull request 2910 reports for creating an instance. %d pods, each one MIG device of %d MiB, are created at once; the figure is from the device plugin's first GPU-instance create to the last pod seen Running with its reservation realised (`hami.io/bind-phase: success`). Each run starts a fresh sandbox.\n\n",
		cfg.SchedulerConfig, cfg.GPUs, cfg.Model, cfg.CreateLatency, cfg.Pods, cfg.MemoryMiB)
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
		fmt.Fprintf(&b, "| the node's hand-off Lease (one pod realised at a time per node) | %d | %d | %s | %.1f s |\n",
			i+1, len(res.Running), strings.Join(profiles, ", "), res.Elapsed.Seconds())
		elapsed = append(elapsed, res.Elapsed.Seconds())
	}
	mean := 0.0
	for _, e := range elapsed {
		mean += e
	}
	mean /= float64(len(elapsed))
	fmt.Fprintf(&b, "\nMean **%.1f s** over %d runs (min %.1f s, max %.1f s).\n\n", mean, len(elapsed), slices.Min(elapsed), slices.Max(elapsed))
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

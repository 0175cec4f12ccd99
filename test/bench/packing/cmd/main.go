// Command packing runs the placement-quality benchmark and writes packing.md and
// packing.svg (make bench-packing).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/dynamig/dynamig/test/bench/machine"
	"github.com/dynamig/dynamig/test/bench/packing"
)

func main() {
	out := flag.String("out", "docs/benchmarks", "directory for packing.md and packing.svg")
	traces := flag.String("traces", "test/bench/packing/testdata/traces", "directory of the trace CSV files (run from the repository root)")
	gpus := flag.Int("gpus", 64, "GPUs of the dynamic replay's cluster")
	fillGPUs := flag.Int("fill-gpus", 8, "GPUs of the static fill's node")
	fillPods := flag.Int("fill-pods", 64, "most pods per static-fill window")
	fillWindows := flag.Int("fill-windows", 16, "static-fill windows per trace")
	noise := flag.Int("noise-replays", 5, "jittered replays of each trace on A100-40GB per load, for the noise section")
	synthetic := flag.Int("synthetic-pods", 6000, "pods per load of the synthetic churn")
	flag.Parse()
	start := time.Now()
	cfg := packing.Config{
		TraceDir: *traces, GPUs: *gpus, Loads: []float64{0.25, 0.5, 0.75, 1, 1.5, 2},
		SyntheticPods: *synthetic, NoiseReplays: *noise, FillGPUs: *fillGPUs, FillPods: *fillPods, FillWindows: *fillWindows,
		Progress: func(s string) { fmt.Fprintf(os.Stderr, "%6.1fs %s\n", time.Since(start).Seconds(), s) },
	}
	rep, err := packing.Run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	m := packing.Machine{Cores: runtime.NumCPU(), CPU: machine.CPUModel(), At: time.Now().UTC().Format("2006-01-02 15:04 MST"),
		Command: machine.Command("go run ./test/bench/packing/cmd")}
	var md, svg bytes.Buffer
	rep.WriteMarkdown(&md, m)
	fmt.Fprintf(&md, "\nRun time: %.0f s.\n", time.Since(start).Seconds())
	rep.WriteSVG(&svg)
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for name, b := range map[string][]byte{"packing.md": md.Bytes(), "packing.svg": svg.Bytes()} {
		if err := os.WriteFile(filepath.Join(*out, name), b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

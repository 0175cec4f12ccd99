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
	"strconv"
	"strings"
	"time"

	"github.com/dynamig/dynamig/test/bench/machine"
	"github.com/dynamig/dynamig/test/bench/packing"
)

func main() {
	out := flag.String("out", "docs/benchmarks", "directory for packing.md and packing.svg")
	traces := flag.String("traces", "test/bench/packing/testdata/traces", "directory of the trace CSV files (run from the repository root)")
	fillGPUs := flag.Int("fill-gpus", 64, "GPUs of the inflation fill's cluster")
	orders := flag.Int("orders", 50, "shuffles of each workload in the inflation fill (the trace's own order comes on top)")
	queueGPUs := flag.String("queue-gpus", "16,64", "cluster sizes of the queueing replay")
	replays := flag.Int("replays", 10, "replays (jittered; generated mixes: seeds) per queueing panel")
	queuePods := flag.Int("queue-pods", 4000, "pods of a generated mix per queueing replay")
	queueLoad := flag.Float64("queue-load", 1, "offered load of the queueing replay")
	relocatable := flag.Float64("relocatable", 0.5, "share of the pods relocatable in the queueing replay's relocation variant (0: none run)")
	dropGPUs := flag.Int("drop-gpus", 64, "GPUs of the secondary drop-on-arrival replay (0: none)")
	staticGPUs := flag.Int("static-gpus", 8, "GPUs of the static fill's node")
	staticPods := flag.Int("static-pods", 64, "most pods per static-fill window")
	staticWindows := flag.Int("static-windows", 16, "static-fill windows per trace")
	flag.Parse()
	var sizes []int
	for _, s := range strings.Split(*queueGPUs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "-queue-gpus: %q is not a positive number\n", s)
			os.Exit(2)
		}
		sizes = append(sizes, n)
	}
	start := time.Now()
	cfg := packing.Config{
		TraceDir: *traces, FillGPUs: *fillGPUs, Orders: *orders,
		QueueGPUs: sizes, QueueReplays: *replays, QueuePods: *queuePods, QueueLoad: *queueLoad, RelocatableShare: *relocatable,
		DropGPUs: *dropGPUs, DropLoads: []float64{0.25, 0.5, 1, 2},
		StaticGPUs: *staticGPUs, StaticPods: *staticPods, StaticWindows: *staticWindows,
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

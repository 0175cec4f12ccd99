// Command burst runs a burst of GPU pods at one node of the sandbox and writes burst.md
// (make bench-burst: 56 one-slice pods at 8 A100-40GB, 1.5 s per GPU-instance create).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/dynamig/dynamig/test/bench/burst"
	"github.com/dynamig/dynamig/test/bench/machine"
	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/sandbox"
)

func main() {
	out := flag.String("out", "docs/benchmarks", "directory for burst.md")
	cfg := burst.Config{}
	flag.StringVar(&cfg.Install, "install", sandbox.DefaultInstall, "the install manifest")
	flag.StringVar(&cfg.Model, "model", "A100-40GB", "the node's GPU model")
	flag.IntVar(&cfg.GPUs, "gpus", 8, "GPUs of the node")
	flag.IntVar(&cfg.Pods, "pods", 56, "pods of the burst, each one MIG device")
	flag.IntVar(&cfg.MemoryMiB, "memory", 4000, "MiB per pod's device (4000: 1g.5gb on an A100-40GB)")
	flag.DurationVar(&cfg.CreateLatency, "create-latency", 1500*time.Millisecond, "simulated time per GPU-instance create")
	flag.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "give up when the pods do not all run within this time")
	runs := flag.Int("runs", 3, "bursts, each on a fresh sandbox")
	flag.Parse()
	cluster.QuietLogs(false)
	var results []*burst.Result
	for range *runs {
		res, err := burst.Run(context.Background(), cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%d pods, first create → last Running %.1f s\n", len(res.Running), res.Elapsed.Seconds())
		results = append(results, res)
	}
	md := burst.Report(results, machine.Command("go run ./test/bench/burst/cmd"), machine.CPUModel(), time.Now())
	path := filepath.Join(*out, "burst.md")
	if err := os.WriteFile(path, md, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("wrote", path)
}

// Command throughput runs the scheduling-throughput benchmark and writes throughput.md
// (make bench-throughput: 100, 500 and 1000 nodes, 5000 pods, about 40 min on 2 cores;
// make bench-throughput-quick: 100 nodes, 1000 pods).
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/test/bench/machine"
	"github.com/dynamig/dynamig/test/bench/throughput"
)

func main() {
	out := flag.String("out", "docs/benchmarks", "directory for throughput.md and the CPU profile")
	nodes := flag.String("nodes", "100,500,1000", "comma-separated node counts")
	pods := flag.Int("pods", 5000, "pods per scenario")
	qps := flag.String("qps", "50/100,5000/5000", "comma-separated scheduler client qps/burst settings")
	rounds := flag.String("rounds", "1,3", "comma-separated rounds of each -qps setting's scenarios at each size (1 where missing)")
	schedConfig := flag.String("scheduler-config", "manifests/scheduler-config.yaml", "the shipped KubeSchedulerConfiguration")
	profile := flag.String("cpuprofile", "throughput-cpu.pprof", "CPU profile of one scenario at the largest size, in -out; empty for none")
	order := flag.String("scenarios", "a,c,g,b,f", "the scenarios to run at each size and QPS, in this order")
	profileScenario := flag.String("profile-scenario", "b", "the scenario -cpuprofile records: a, b, c, d, e or f")
	timeout := flag.Duration("timeout", 0, "per scenario, from its first create: pods not bound by then are reported as such (0: 5 min + 100 ms per pod)")
	nodesToScore := flag.Int("percentage-of-nodes-to-score", 0, "percentageOfNodesToScore for every scenario (0: the configuration's)")
	mixed := flag.String("mixed", "5000/500", "the mixed cluster run after the sizes, nodes/GPU nodes, at the last QPS; empty for none")
	logPath := flag.String("log", "", "file for the control plane's and scheduler's logs (default: a temporary file, removed on success)")
	flag.Parse()

	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cfg := throughput.Config{SchedulerConfig: *schedConfig, Pods: *pods, Timeout: *timeout, Order: strings.Split(*order, ","), PercentageOfNodesToScore: *nodesToScore}
	if *nodesToScore < 0 || *nodesToScore > 100 {
		fail(fmt.Errorf("-percentage-of-nodes-to-score: %d is not between 0 and 100", *nodesToScore))
	}
	for _, s := range strings.Split(*nodes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			fail(fmt.Errorf("-nodes: bad count %q", s))
		}
		cfg.Nodes = append(cfg.Nodes, n)
	}
	for _, s := range strings.Split(*qps, ",") {
		q, b, ok := strings.Cut(strings.TrimSpace(s), "/")
		qv, err1 := strconv.ParseFloat(q, 64)
		bv, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil {
			fail(fmt.Errorf("-qps: bad setting %q (want qps/burst)", s))
		}
		cfg.QPS = append(cfg.QPS, throughput.QPS{QPS: qv, Burst: bv})
	}
	for _, s := range strings.Split(*rounds, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || r <= 0 {
			fail(fmt.Errorf("-rounds: bad count %q", s))
		}
		cfg.Rounds = append(cfg.Rounds, r)
	}
	if *mixed != "" {
		n, g, ok := strings.Cut(*mixed, "/")
		nv, err1 := strconv.Atoi(n)
		gv, err2 := strconv.Atoi(g)
		if !ok || err1 != nil || err2 != nil || gv < 0 || gv > nv {
			fail(fmt.Errorf("-mixed: bad setting %q (want nodes/GPU nodes, GPU nodes at most nodes)", *mixed))
		}
		cfg.Mixed = throughput.MixedCluster{Nodes: nv, GPUNodes: gv}
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fail(err)
	}
	if *profile != "" {
		cfg.CPUProfile = filepath.Join(*out, *profile)
		cfg.ProfileScenario = *profileScenario
	}

	// The API server and the scheduler log a lot through klog: into a file.
	keepLog := *logPath != ""
	if !keepLog {
		f, err := os.CreateTemp("", "dynamig-throughput-*.log")
		if err != nil {
			fail(err)
		}
		f.Close()
		*logPath = f.Name()
	}
	logFile, err := os.Create(*logPath)
	if err != nil {
		fail(err)
	}
	throughput.RedirectKlog(logFile)
	cfg.Log = logFile

	start := time.Now()
	cfg.Progress = func(s string) { fmt.Fprintf(os.Stderr, "%6.1fs %s\n", time.Since(start).Seconds(), s) }
	rep, err := throughput.Run(context.Background(), cfg)
	klog.Flush()
	logFile.Close()
	if err != nil {
		fail(fmt.Errorf("%v\nlogs: %s", err, *logPath))
	}
	if !keepLog {
		_ = os.Remove(*logPath)
	}
	m := throughput.Machine{Cores: runtime.NumCPU(), CPU: machine.CPUModel(), At: time.Now().UTC().Format("2006-01-02 15:04 MST"),
		Command: machine.Command("go run ./test/bench/throughput/cmd"), Took: time.Since(start)}
	var md bytes.Buffer
	rep.WriteMarkdown(&md, m)
	p := filepath.Join(*out, "throughput.md")
	if err := os.WriteFile(p, md.Bytes(), 0o644); err != nil {
		fail(err)
	}
	fmt.Fprintf(os.Stderr, "wrote %s\n", p)
}

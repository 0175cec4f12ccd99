package burst

import (
	"context"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dynamig/dynamig/test/cluster"
)

func TestMain(m *testing.M) {
	flag.Parse()
	cluster.QuietLogs(testing.Verbose())
	os.Exit(m.Run())
}

// TestSmoke runs a burst of four one-slice pods at one simulated A100 whose creates take
// 50 ms each: every pod runs on a 1g.5gb instance, and the burst cannot be faster than its
// GPU's creates one after another.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a sandbox")
	}
	const latency = 50 * time.Millisecond
	res, err := Run(context.Background(), Config{Install: "../../../manifests/install.yaml",
		Model: "A100-40GB", GPUs: 1, Pods: 4, MemoryMiB: 4000, CreateLatency: latency, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Running) != 4 || res.Profiles["1g.5gb"] != 4 || len(res.Profiles) != 1 {
		t.Errorf("running %d, instances %v", len(res.Running), res.Profiles)
	}
	if res.FirstCreate.IsZero() || res.Elapsed < 4*latency {
		t.Errorf("elapsed %v from the first create (%v), want at least 4 × %v", res.Elapsed, res.FirstCreate, latency)
	}
	if md := string(Report([]*Result{res}, "go test", "a machine", time.Now())); !strings.Contains(md, "| 1 | 4 | 4 × 1g.5gb |") {
		t.Errorf("report:\n%s", md)
	}
}

// The report cites the hand-off Lease design's figure as the "before" of the same burst, and
// only of the same burst.
func TestReportCitesBaseline(t *testing.T) {
	cfg := LeaseBaseline.Config
	cfg.Install = "manifests/install.yaml"
	first := time.Unix(1000, 0)
	res := &Result{Config: cfg, FirstCreate: first, Profiles: map[string]int{"1g.5gb": cfg.Pods}}
	for i := range cfg.Pods {
		res.Running = append(res.Running, first.Add(time.Duration(i+1)*200*time.Millisecond))
	}
	res.Elapsed = res.Running[len(res.Running)-1].Sub(first)
	md := string(Report([]*Result{res}, "go test", "a machine", first))
	for _, want := range []string{"| " + Design + " | 1 | 56 | 56 × 1g.5gb | 11.2 s |", "Mean **11.2 s**",
		"Before: " + LeaseBaseline.Design + ", the same burst, mean **106.1 s** over 3 runs", LeaseBaseline.Source, "0.11 × the time, 94.9 s less"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	res.Config.Pods = 4
	if md := string(Report([]*Result{res}, "go test", "a machine", first)); !strings.Contains(md, "for a different burst") || strings.Contains(md, "× the time") {
		t.Errorf("a different burst compared with the baseline:\n%s", md)
	}
}

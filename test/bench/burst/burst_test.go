package burst

import (
	"context"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dynamig/dynamig/test/sandbox"
)

func TestMain(m *testing.M) {
	flag.Parse()
	sandbox.QuietLogs(testing.Verbose())
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
	res, err := Run(context.Background(), Config{SchedulerConfig: "../../../manifests/scheduler-config.yaml",
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

// Package sandboxtest is what the sandbox suites (test/e2e, test/faults, test/workloads)
// share: a test's handle on a running sandbox cluster, the pod steps every test takes, and
// their TestMain (Main).
package sandboxtest

import (
	"context"
	"maps"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/dynamig/dynamig/test/cluster"
	"github.com/dynamig/dynamig/test/sandbox"
)

// World is one test's sandbox: the test, its context, the sandbox and its API client.
type World struct {
	T   *testing.T
	Ctx context.Context
	SB  *sandbox.Sandbox
	C   kubernetes.Interface
}

// Start starts a sandbox of opts for the test, giving it startup to come up, and stops
// it when the test ends.
func Start(t *testing.T, opts sandbox.Options, startup time.Duration) World {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sctx, scancel := context.WithTimeout(ctx, startup)
	defer scancel()
	sb, err := sandbox.Start(sctx, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Stop(); cancel() })
	return World{T: t, Ctx: ctx, SB: sb, C: sb.Client()}
}

// For is w for a subtest t.
func (w World) For(t *testing.T) World {
	w.T = t
	return w
}

// Create creates the pods, failing the test on the first error.
func (w *World) Create(pods ...*v1.Pod) {
	w.T.Helper()
	for _, p := range pods {
		if _, err := w.C.CoreV1().Pods(p.Namespace).Create(w.Ctx, p, metav1.CreateOptions{}); err != nil {
			w.T.Fatalf("creating %s: %v", p.Name, err)
		}
	}
}

// Get reads the pod name of namespace default.
func (w *World) Get(name string) *v1.Pod {
	w.T.Helper()
	p, err := w.C.CoreV1().Pods("default").Get(w.Ctx, name, metav1.GetOptions{})
	if err != nil {
		w.T.Fatal(err)
	}
	return p
}

// WaitFor polls cond until it holds, failing the test after timeout with what cond last
// said.
func (w *World) WaitFor(what string, timeout time.Duration, cond func() (bool, string)) {
	w.T.Helper()
	var last string
	err := wait.PollUntilContextTimeout(w.Ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, why := cond()
		last = why
		return ok, nil
	})
	if err != nil {
		w.T.Fatalf("waiting %v for %s: %s", timeout, what, last)
	}
}

// SchedulerSample is the value of the sample of the scheduler's DynamicMIG metric name that
// has exactly these labels (none: nil), as a scrape shows it now (cluster.Scrape); false when
// there is no such sample.
func (w *World) SchedulerSample(name string, labels map[string]string) (float64, bool) {
	w.T.Helper()
	families, err := cluster.Scrape(w.Ctx, w.SB.SchedulerMetrics())
	if err != nil {
		w.T.Fatal(err)
	}
	for _, m := range families[name].GetMetric() {
		if !maps.Equal(cluster.Labels(m), labels) {
			continue
		}
		if m.Counter != nil {
			return m.GetCounter().GetValue(), true
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

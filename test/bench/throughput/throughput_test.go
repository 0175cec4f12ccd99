package throughput

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"

	"github.com/dynamig/dynamig/test/cluster"
)

// A tiny run of every scenario and of the mixed cluster: every pod is bound, each pod costs
// exactly one scheduler write at the API server (its Binding, which for a GPU pod carries the
// reservation; the mixed cluster's default scheduler writes as the admin, uncounted; the floor's
// binder writes as the scheduler), and the
// stand-in device plugin runs in (f) only, making one write per GPU pod.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	logPath := filepath.Join(t.TempDir(), "control-plane.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	RedirectKlog(logFile)
	const pods = 20
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{
		SchedulerConfig: "../../../manifests/scheduler-config.yaml",
		Nodes:           []int{5},
		Pods:            pods,
		QPS:             []QPS{HighQPS},
		Mixed:           MixedCluster{Nodes: 8, GPUNodes: 3},
		Log:             logFile,
		Progress:        func(s string) { t.Log(s) },
	})
	if err != nil {
		if raw, rerr := os.ReadFile(logPath); rerr == nil && len(raw) > 4000 {
			t.Logf("log tail:\n%s", raw[len(raw)-4000:])
		}
		t.Fatal(err)
	}
	if len(rep.Results) != len(Scenarios)+2 {
		t.Fatalf("%d results, want %d: every scenario's and the mixed cluster's two", len(rep.Results), len(Scenarios)+2)
	}
	// A scenario of 20 pods is a few samples of its scheduler's goroutines, maybe none: their
	// sum over the scenarios shows the labels reach them.
	var schedulerCPU time.Duration
	for _, r := range rep.Results {
		schedulerCPU += r.SchedulerCPU
		if r.SchedulerCPU < 0 || r.SchedulerCPU > r.CPU || (r.Scenario.Mixed && r.SchedulerCPU != 0) {
			t.Errorf("(%s): the scheduler's CPU %v of the process's %v", r.Scenario.Key, r.SchedulerCPU, r.CPU)
		}
		if r.Bound != pods || r.Incomplete {
			t.Errorf("(%s): %d of %d pods bound", r.Scenario.Key, r.Bound, pods)
		}
		if r.PodsPerSec <= 0 || r.P50 <= 0 || r.P99 < r.P50 || r.PeakRSSKiB <= 0 || r.CPU <= 0 {
			t.Errorf("(%s): implausible figures %+v", r.Scenario.Key, r)
		}
		if r.Scenario.Key == MixedCPU.Key {
			if r.WritesTotal != 0 {
				t.Errorf("(%s): %v counted as the scheduler's writes, want none (the default scheduler writes as the admin)", r.Scenario.Key, r.Writes)
			}
		} else if bindings(r) != pods || r.WritesTotal != r.Writes[binding] {
			t.Errorf("(%s): scheduler writes %v (total %d, refused %v), want %d: one Binding per pod and nothing else",
				r.Scenario.Key, r.Writes, r.WritesTotal, r.Refused, pods)
		}
		want := int64(0)
		if r.Scenario.StandIn {
			want = pods // the device plugin's one patch per GPU pod
		}
		if r.StandInWrites != want {
			t.Errorf("(%s): stand-in writes %d, want %d (one pod patch per GPU pod)", r.Scenario.Key, r.StandInWrites, want)
		}
	}
	if schedulerCPU == 0 {
		t.Error("no CPU profile sample of any scenario's scheduler")
	}
	var md strings.Builder
	rep.WriteMarkdown(&md, Machine{})
	for _, want := range []string{cluster.StandInWrite, "## Batching", "## The scheduler's own CPU per pod", "## Mixed cluster", "GPU pods' rate over CPU pods' rate", "## What a scheduler adds to its pods' floor"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, md.String())
		}
	}
	if _, floor, _ := strings.Cut(md.String(), "## What a scheduler adds to its pods' floor"); !strings.Contains(floor, "| 5 | 5000/5000 | ") {
		t.Errorf("the floor section has no row of the 5 nodes at QPS 5000:\n%s", floor)
	}
}

const binding = "create pods/binding"

// bindings counts the scheduler's Binding requests, answered with success or not: under
// load a Binding can be applied while its request ends in an error (its context ends during
// the etcd write: the log shows the canceled Txn), and the pod is bound by that one request.
// One Binding request per pod is what the cost claim is about; a second Binding for a pod
// would still count twice.
func bindings(r Result) int {
	n := r.Writes[binding]
	for k, v := range r.Refused {
		if strings.HasPrefix(k, binding+" ") {
			n += v
		}
	}
	return n
}

// A scenario's row is its median round, and each round's pods/s comes with its ratio to
// (a)'s in the same round; each round starts one scenario later.
func TestRounds(t *testing.T) {
	cfg := Config{QPS: []QPS{DefaultQPS, HighQPS}, Rounds: []int{1, 3}, Order: []string{"a", "c", "b"}}
	if cfg.rounds(0) != 1 || cfg.rounds(1) != 3 || (Config{}).rounds(0) != 1 {
		t.Errorf("rounds: %d %d, want 1 3", cfg.rounds(0), cfg.rounds(1))
	}
	keys := func(round int) (out []string) {
		for _, sc := range cfg.order(round) {
			out = append(out, sc.Key)
		}
		return out
	}
	if !slices.Equal(keys(0), []string{"a", "c", "b"}) || !slices.Equal(keys(1), []string{"c", "b", "a"}) ||
		!slices.Equal(keys(2), []string{"b", "a", "c"}) || !slices.Equal(keys(3), keys(0)) {
		t.Errorf("orders of rounds 1 to 4: %v %v %v %v, want a c b, c b a, b a c, a c b", keys(0), keys(1), keys(2), keys(3))
	}
	rep := &Report{Config: cfg}
	a, b := Scenarios[0], Scenarios[3]
	for i, rates := range [][2]float64{{300, 330}, {400, 360}, {350, 420}} {
		rep.Results = append(rep.Results, Result{Nodes: 100, QPS: HighQPS, Scenario: a, Round: i, PodsPerSec: rates[0]},
			Result{Nodes: 100, QPS: HighQPS, Scenario: b, Round: i, PodsPerSec: rates[1]})
	}
	if x := rep.find(100, HighQPS, "a"); x == nil || x.PodsPerSec != 350 {
		t.Errorf("median round of (a): %+v, want 350 pods/s", x)
	}
	if x := rep.find(100, HighQPS, "b"); x == nil || x.PodsPerSec != 360 {
		t.Errorf("median round of (b): %+v, want 360 pods/s", x)
	}
	if got, want := rep.roundRates(100, HighQPS, "b"), "330.0 (1.10), 360.0 (0.90), 420.0 (1.20)"; got != want {
		t.Errorf("rounds of (b): %q, want %q", got, want)
	}
	for i, ms := range []time.Duration{4, 3, 5} {
		rep.Results[2*i].CPU = ms * time.Millisecond * 1000
		rep.Results[2*i].Bound = 1000
	}
	if got, want := rep.cpuCell(100, HighQPS, "a", (*Result).CPUPerPod), "4.00 ms (4.00, 3.00, 5.00)"; got != want {
		t.Errorf("CPU per pod of (a): %q, want %q (the median of the rounds, which is not the median round's by pods/s)", got, want)
	}
	if got, want := rep.roundRatios(100, HighQPS, "b"), "1.10 (0.90–1.20; 2 of 3 ≥ 1)"; got != want {
		t.Errorf("round ratios of (b): %q, want %q", got, want)
	}
	if frac, nodes, key, ok := rep.spread(); !ok || nodes != 100 || key != "a" || frac < 0.3333 || frac > 0.3334 {
		t.Errorf("spread: %.4f at %d nodes in (%s), ok %v; want 0.3333 (400/300 − 1) in (a) at 100 nodes, more than (b)'s 420/330 − 1", frac, nodes, key, ok)
	}
	if _, _, _, ok := (&Report{Config: cfg, Results: rep.Results[:2]}).spread(); ok {
		t.Error("spread of one round per scenario: ok, want none")
	}
	if rep.find(100, DefaultQPS, "a") != nil {
		t.Error("found a result of a QPS that did not run")
	}
}

// TestDefaultPluginsProfile: (a)'s profile is kube-scheduler's default profile, plugin for
// plugin at every extension point (an earlier (a) kept the shipped profile's
// NodeResourcesFit score off, so its CPU pods skipped a score every default scheduler runs).
func TestDefaultPluginsProfile(t *testing.T) {
	dir := t.TempDir()
	load := func(name string, doc map[string]any) *schedconfig.KubeSchedulerProfile {
		t.Helper()
		raw, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := options.LoadConfigFromFile(klog.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		if len(cfg.Profiles) != 1 {
			t.Fatalf("%s: %d profiles", name, len(cfg.Profiles))
		}
		return &cfg.Profiles[0]
	}
	raw, err := os.ReadFile("../../../manifests/scheduler-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var shipped map[string]any
	if err := yaml.Unmarshal(raw, &shipped); err != nil {
		t.Fatal(err)
	}
	if err := editConfig(shipped, DefaultPlugins, 5000, 5000, 0, ""); err != nil {
		t.Fatal(err)
	}
	got := load("a.yaml", shipped)
	want := load("default.yaml", map[string]any{
		"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
		"profiles": []any{map[string]any{"schedulerName": SchedulerName}},
	})
	if diff := cmp.Diff(want.Plugins, got.Plugins); diff != "" {
		t.Errorf("(a)'s plugins differ from kube-scheduler's default profile (-default +(a)):\n%s", diff)
	}
	// Every plugin's args are the defaults but NodeResourcesFit's ignoredResources.
	defaults := map[string]schedconfig.PluginConfig{}
	for _, pc := range want.PluginConfig {
		defaults[pc.Name] = pc
	}
	for _, pc := range got.PluginConfig {
		if pc.Name == "NodeResourcesFit" {
			continue
		}
		if diff := cmp.Diff(defaults[pc.Name], pc); diff != "" {
			t.Errorf("(a)'s args of %s are not the defaults (-default +(a)):\n%s", pc.Name, diff)
		}
	}
}

// TestParseTagTotal reads a label value's CPU from `go tool pprof -tags -unit=ms` output
// (this text is the tool's, from a profile of two goroutines, one labelled).
func TestParseTagTotal(t *testing.T) {
	const out = ` other: Total 40ms of 530ms ( 7.55%)
        40ms ( 7.55%): scheduler
 part: Total 1170.50ms of 1530ms (76.50%)
       1000ms (65.36%): harness
     170.50ms (11.14%): scheduler
`
	for _, c := range []struct {
		key, value string
		want       time.Duration
	}{
		{"part", "scheduler", 170500 * time.Microsecond}, // not other's scheduler
		{"part", "harness", time.Second},
		{"part", "etcd", 0},
		{"missing", "scheduler", 0},
	} {
		got, err := parseTagTotal(out, c.key, c.value)
		if err != nil || got != c.want {
			t.Errorf("%s=%s: %v, %v; want %v", c.key, c.value, got, err, c.want)
		}
	}
	if _, err := parseTagTotal(" part: Total 1.2s of 2s (60%)\n   1.2s (60%): scheduler\n", "part", "scheduler"); err == nil {
		t.Error("an amount not in ms: no error")
	}
}

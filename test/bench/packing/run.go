package packing

import (
	"fmt"
	"path/filepath"
)

// Config sizes a benchmark run.
type Config struct {
	// TraceDir holds openb_pod_list_default.csv and openb_pod_list_gpushare100.csv.
	TraceDir string
	// GPUs is the dynamic replay's cluster size; Loads the offered loads.
	GPUs  int
	Loads []float64
	// MaxPods caps the pods taken from each trace (0: all).
	MaxPods int
	// SyntheticPods per load of the synthetic churn.
	SyntheticPods int
	// NoiseReplays is the number of jittered replays (JitterJobs) of each trace on
	// A100-40GB per load and policy; 0 for none.
	NoiseReplays int
	// FillGPUs, FillPods, FillWindows size the static fill (one node).
	FillGPUs, FillPods, FillWindows int
	// Check verifies the state after every placement (slow; tests).
	Check bool
	// Progress, if set, is told what runs.
	Progress func(string)
}

// Traces are the trace files used, by label.
var Traces = []struct{ Label, File string }{
	{"default", "openb_pod_list_default.csv"},
	{"gpushare100", "openb_pod_list_gpushare100.csv"},
}

// Setup is one cluster configuration of the dynamic replay.
type Setup struct {
	Model       string
	AllProfiles bool
}

// Setups are the cluster configurations: default allowlists, and one with every profile.
var Setups = []Setup{{"A100-40GB", false}, {"H100-80GB", false}, {"A100-40GB", true}}

// Panel is one workload on one cluster: an outcome per policy and load.
type Panel struct {
	Workload string // trace label or "synthetic"
	Cluster  string
	GPUs     int
	Pods     int
	Outcomes []Outcome // per load, per policy in Policies() order
	// Capacity is ReplayCapacity per load: the reference.
	Capacity []Outcome
}

// Report is everything a run measured.
type Report struct {
	Config   Config
	Policies []string
	Panels   []Panel
	Fill     []FillSummary
	Noise    []NoisePanel
}

// NoisePanel is a trace's jittered replays: Acceptance[load][policy][replay].
type NoisePanel struct {
	Workload, Cluster string
	Acceptance        [][][]float64
}

// FillSummary is the static fill of one trace on one small cluster.
type FillSummary struct {
	Workload, Cluster string
	Results           []FillResult
}

// fillMisses ends a static-fill window after this many trace pods in a row did not fit.
const fillMisses = 8

// Run runs every experiment.
func Run(cfg Config) (*Report, error) {
	progress := cfg.Progress
	if progress == nil {
		progress = func(string) {}
	}
	policies := Policies()
	rep := &Report{Config: cfg}
	for _, p := range policies {
		rep.Policies = append(rep.Policies, p.Name())
	}
	traces := map[string][]Pod{}
	for _, t := range Traces {
		pods, err := LoadTrace(filepath.Join(cfg.TraceDir, t.File))
		if err != nil {
			return nil, err
		}
		if cfg.MaxPods > 0 && len(pods) > cfg.MaxPods {
			pods = pods[:cfg.MaxPods]
		}
		traces[t.Label] = pods
	}
	for _, s := range Setups {
		c, err := NewCluster(s.Model, cfg.GPUs, s.AllProfiles)
		if err != nil {
			return nil, err
		}
		workloads := []string{}
		for _, t := range Traces {
			workloads = append(workloads, t.Label)
		}
		if !s.AllProfiles && cfg.SyntheticPods > 0 {
			workloads = append(workloads, "synthetic")
		}
		for _, w := range workloads {
			panel := Panel{Workload: w, Cluster: c.Label(), GPUs: c.GPUs()}
			for li, load := range cfg.Loads {
				var jobs []Job
				if w == "synthetic" {
					jobs = SyntheticJobs(c, cfg.SyntheticPods, load, uint64(1000+li))
				} else {
					jobs = TraceJobs(c, traces[w], load)
				}
				panel.Pods = len(jobs)
				panel.Capacity = append(panel.Capacity, ReplayCapacity(c, jobs, load))
				for _, p := range policies {
					progress(fmt.Sprintf("%s on %d × %s, load %.2f, %s", w, c.GPUs(), c.Label(), load, p.Name()))
					o, err := Replay(c, p, jobs, load, cfg.Check)
					if err != nil {
						return nil, fmt.Errorf("%s on %s, load %.2f: %w", w, c.Label(), load, err)
					}
					panel.Outcomes = append(panel.Outcomes, o)
				}
			}
			rep.Panels = append(rep.Panels, panel)
		}
	}
	if cfg.NoiseReplays > 0 {
		c, err := NewCluster("A100-40GB", cfg.GPUs, false)
		if err != nil {
			return nil, err
		}
		for _, t := range Traces {
			np := NoisePanel{Workload: t.Label, Cluster: fmt.Sprintf("%d × %s", c.GPUs(), c.Label())}
			for _, load := range cfg.Loads {
				jobs := TraceJobs(c, traces[t.Label], load)
				perPolicy := make([][]float64, len(policies))
				for k := range cfg.NoiseReplays {
					jittered := JitterJobs(jobs, uint64(k+1))
					progress(fmt.Sprintf("jittered replay %d of %s on %s, load %.2f", k+1, t.Label, np.Cluster, load))
					for pi, p := range policies {
						o, err := Replay(c, p, jittered, load, cfg.Check)
						if err != nil {
							return nil, err
						}
						perPolicy[pi] = append(perPolicy[pi], o.Acceptance())
					}
				}
				np.Acceptance = append(np.Acceptance, perPolicy)
			}
			rep.Noise = append(rep.Noise, np)
		}
	}
	if cfg.FillWindows > 0 && cfg.FillPods > 0 {
		for _, s := range []Setup{{"A100-40GB", false}, {"H100-80GB", false}} {
			c, err := NewCluster(s.Model, cfg.FillGPUs, s.AllProfiles)
			if err != nil {
				return nil, err
			}
			for _, t := range Traces {
				pods := traces[t.Label]
				sum := FillSummary{Workload: t.Label, Cluster: fmt.Sprintf("%d × %s", c.GPUs(), c.Label())}
				for w := range cfg.FillWindows {
					start := w * (len(pods) - cfg.FillPods) / max(1, cfg.FillWindows-1)
					if cfg.FillWindows == 1 {
						start = 0
					}
					if start < 0 || start >= len(pods) {
						break
					}
					window := FillWindow(c, pods, start, cfg.FillPods, fillMisses)
					progress(fmt.Sprintf("static fill %s on %s, window at %d (%d pods)", t.Label, sum.Cluster, start, len(window)))
					r, err := StaticFill(c, policies, window, cfg.Check)
					if err != nil {
						return nil, err
					}
					r.Window = start
					sum.Results = append(sum.Results, r)
				}
				rep.Fill = append(rep.Fill, sum)
			}
		}
	}
	return rep, nil
}

package packing

import (
	"fmt"
	"path/filepath"
	"runtime"
	"sync"

	"golang.org/x/sync/errgroup"
)

// Config sizes a benchmark run.
type Config struct {
	// TraceDir holds openb_pod_list_default.csv and openb_pod_list_gpushare100.csv.
	TraceDir string
	// MaxPods caps the pods taken from each trace (0: all).
	MaxPods int
	// FillGPUs is the inflation fill's cluster; Orders the shuffles (order 0, the trace's
	// own order, comes on top).
	FillGPUs, Orders int
	// QueueGPUs are the queueing replay's cluster sizes; QueueReplays the jittered
	// replays (generated mixes: seeds) per size; QueueLoad the offered load; QueuePods the
	// pods of a generated mix per replay.
	QueueGPUs               []int
	QueueReplays, QueuePods int
	QueueLoad               float64
	// RelocatableShare is the share of pods relocatable in the queueing replay's relocation
	// variant (QueueReplayRelocating); 0: none run.
	RelocatableShare float64
	// DropGPUs and DropLoads size the secondary drop-on-arrival replay (0 GPUs: none).
	DropGPUs  int
	DropLoads []float64
	// StaticGPUs, StaticPods, StaticWindows size the static fill (one node; 0 windows:
	// none).
	StaticGPUs, StaticPods, StaticWindows int
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

// Models are the GPU models compared, each with its default allowlist.
var Models = []string{"A100-40GB", "H100-80GB"}

// Policies are the policies compared, dynamig first.
func Policies() []Policy {
	return []Policy{Dynamig{FragmentationAware: true}, Dynamig{}, HAMi{}, HAMiMain{}, FirstFit{}}
}

// InflationPanel is one workload's inflation fill on one cluster.
type InflationPanel struct {
	Workload, Cluster string
	GPUs              int
	// Runs[policy][order].
	Runs [][]InflationRun
	// Per order: the capacity bound at 100 % offered (the offered share then), and the
	// per-GPU packing bound at 100 % and 130 %.
	Capacity100, Packing100, Packing130 []float64
}

// QueuePanel is one workload's queueing replays on one cluster.
type QueuePanel struct {
	Workload, Cluster string
	GPUs, Pods        int
	// TimeUnit names the unit of the waits.
	TimeUnit string
	// Runs[policy][replay].
	Runs [][]QueueOutcome
	// Relocating[replay] is dynamig with relocation on the same replays (RelocatableShare).
	Relocating []QueueOutcome
}

// Panel is the drop-on-arrival replay of one workload on one cluster: an outcome per
// policy and load.
type Panel struct {
	Workload, Cluster string
	GPUs, Pods        int
	Outcomes          []Outcome // per load, per policy in Policies() order
	// Capacity is ReplayCapacity per load: the reference.
	Capacity []Outcome
}

// FillSummary is the static fill of one trace on one small cluster.
type FillSummary struct {
	Workload, Cluster string
	Results           []FillResult
}

// Report is everything a run measured.
type Report struct {
	Config    Config
	Policies  []string
	Workloads []*Workload
	Inflation []InflationPanel
	Queue     []QueuePanel
	Drop      []Panel
	Static    []FillSummary
}

// fillMisses ends a static-fill window after this many trace pods in a row did not fit.
const fillMisses = 8

// Run runs every experiment; independent runs go in parallel, one per core.
func Run(cfg Config) (*Report, error) {
	progress := cfg.Progress
	if progress == nil {
		progress = func(string) {}
	}
	var mu sync.Mutex
	say := func(s string) { mu.Lock(); progress(s); mu.Unlock() }
	policies := Policies()
	rep := &Report{Config: cfg}
	for _, p := range policies {
		rep.Policies = append(rep.Policies, p.Name())
	}
	for _, t := range Traces {
		pods, err := LoadTrace(filepath.Join(cfg.TraceDir, t.File))
		if err != nil {
			return nil, err
		}
		if cfg.MaxPods > 0 && len(pods) > cfg.MaxPods {
			pods = pods[:cfg.MaxPods]
		}
		rep.Workloads = append(rep.Workloads, &Workload{Name: t.Label, Trace: pods})
	}
	rep.Workloads = append(rep.Workloads, &Workload{Name: "inference", Mix: InferenceMix}, &Workload{Name: "multi-gpu", Mix: MultiGPUMix})

	var g errgroup.Group
	g.SetLimit(runtime.NumCPU())
	// Panels are sized up front: goroutines hold their addresses while more are appended.
	rep.Inflation = make([]InflationPanel, 0, len(Models)*len(rep.Workloads))
	if cfg.FillGPUs > 0 {
		for _, model := range Models {
			c, err := NewCluster(model, cfg.FillGPUs, false)
			if err != nil {
				return nil, err
			}
			for _, w := range rep.Workloads {
				rep.Inflation = append(rep.Inflation, InflationPanel{Workload: w.Name, Cluster: c.Label(), GPUs: c.GPUs()})
				panel := &rep.Inflation[len(rep.Inflation)-1]
				orders := cfg.Orders + 1
				panel.Runs = make([][]InflationRun, len(policies))
				for pi := range policies {
					panel.Runs[pi] = make([]InflationRun, orders)
				}
				panel.Capacity100 = make([]float64, orders)
				panel.Packing100 = make([]float64, orders)
				panel.Packing130 = make([]float64, orders)
				for order := range orders {
					g.Go(func() error {
						offered, err := w.Offered(c, order, int(MaxOffered*float64(c.Capacity()))+1)
						if err != nil {
							return err
						}
						if order%10 == 0 {
							say(fmt.Sprintf("inflation fill of %s on %d × %s, order %d", w.Name, c.GPUs(), c.Label(), order))
						}
						_, at100, at130, share100 := offeredPoints(c, offered)
						panel.Capacity100[order] = share100
						if panel.Packing100[order], err = c.PackingBound(offered[:at100]); err != nil {
							return err
						}
						if panel.Packing130[order], err = c.PackingBound(offered[:at130]); err != nil {
							return err
						}
						for pi, p := range policies {
							run, err := Inflate(c, p, offered, cfg.Check)
							if err != nil {
								return fmt.Errorf("inflation fill of %s on %s, order %d: %w", w.Name, c.Label(), order, err)
							}
							panel.Runs[pi][order] = run
						}
						return nil
					})
				}
			}
		}
	}
	rep.Queue = make([]QueuePanel, 0, len(Models)*len(rep.Workloads)*len(cfg.QueueGPUs))
	for _, gpus := range cfg.QueueGPUs {
		for _, model := range Models {
			c, err := NewCluster(model, gpus, false)
			if err != nil {
				return nil, err
			}
			for _, w := range rep.Workloads {
				unit, _ := w.TimeUnit()
				rep.Queue = append(rep.Queue, QueuePanel{Workload: w.Name, Cluster: c.Label(), GPUs: c.GPUs(), TimeUnit: unit})
				panel := &rep.Queue[len(rep.Queue)-1]
				panel.Runs = make([][]QueueOutcome, len(policies))
				for pi := range policies {
					panel.Runs[pi] = make([]QueueOutcome, cfg.QueueReplays)
				}
				for replay := range cfg.QueueReplays {
					jobs, err := w.Jobs(c, cfg.QueueLoad, cfg.QueuePods, replay)
					if err != nil {
						return nil, err
					}
					panel.Pods = len(jobs)
					if share := cfg.RelocatableShare; share > 0 {
						if panel.Relocating == nil {
							panel.Relocating = make([]QueueOutcome, cfg.QueueReplays)
						}
						g.Go(func() error {
							say(fmt.Sprintf("queueing replay %d of %s on %d × %s, dynamig relocating", replay, w.Name, c.GPUs(), c.Label()))
							_, unit := w.TimeUnit()
							o, err := QueueReplayRelocating(c, jobs, unit, share, cfg.Check)
							if err != nil {
								return fmt.Errorf("queueing replay %d of %s on %s, relocating: %w", replay, w.Name, c.Label(), err)
							}
							panel.Relocating[replay] = o
							return nil
						})
					}
					for pi, p := range policies {
						g.Go(func() error {
							say(fmt.Sprintf("queueing replay %d of %s on %d × %s, %s", replay, w.Name, c.GPUs(), c.Label(), p.Name()))
							_, unit := w.TimeUnit()
							o, err := QueueReplay(c, p, jobs, unit, cfg.Check)
							if err != nil {
								return fmt.Errorf("queueing replay %d of %s on %s: %w", replay, w.Name, c.Label(), err)
							}
							panel.Runs[pi][replay] = o
							return nil
						})
					}
				}
			}
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if cfg.DropGPUs > 0 {
		for _, model := range Models {
			c, err := NewCluster(model, cfg.DropGPUs, false)
			if err != nil {
				return nil, err
			}
			for _, w := range rep.Workloads[:len(Traces)] {
				panel := Panel{Workload: w.Name, Cluster: c.Label(), GPUs: c.GPUs()}
				for _, load := range cfg.DropLoads {
					jobs := TraceJobs(c, w.Trace, load)
					panel.Pods = len(jobs)
					panel.Capacity = append(panel.Capacity, ReplayCapacity(c, jobs, load))
					for _, p := range policies {
						say(fmt.Sprintf("drop replay of %s on %d × %s, load %.2f, %s", w.Name, c.GPUs(), c.Label(), load, p.Name()))
						o, err := Replay(c, p, jobs, load, cfg.Check)
						if err != nil {
							return nil, fmt.Errorf("%s on %s, load %.2f: %w", w.Name, c.Label(), load, err)
						}
						panel.Outcomes = append(panel.Outcomes, o)
					}
				}
				rep.Drop = append(rep.Drop, panel)
			}
		}
	}
	if cfg.StaticWindows > 0 && cfg.StaticPods > 0 {
		for _, model := range Models {
			c, err := NewCluster(model, cfg.StaticGPUs, false)
			if err != nil {
				return nil, err
			}
			for _, w := range rep.Workloads[:len(Traces)] {
				pods := w.Trace
				sum := FillSummary{Workload: w.Name, Cluster: fmt.Sprintf("%d × %s", c.GPUs(), c.Label())}
				for k := range cfg.StaticWindows {
					start := k * (len(pods) - cfg.StaticPods) / max(1, cfg.StaticWindows-1)
					if cfg.StaticWindows == 1 {
						start = 0
					}
					if start < 0 || start >= len(pods) {
						break
					}
					window := FillWindow(c, pods, start, cfg.StaticPods, fillMisses)
					say(fmt.Sprintf("static fill %s on %s, window at %d (%d pods)", w.Name, sum.Cluster, start, len(window)))
					r, err := StaticFill(c, policies, window, cfg.Check)
					if err != nil {
						return nil, err
					}
					r.Window = start
					sum.Results = append(sum.Results, r)
				}
				rep.Static = append(rep.Static, sum)
			}
		}
	}
	return rep, nil
}

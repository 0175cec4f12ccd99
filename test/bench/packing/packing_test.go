package packing

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

func cluster(t *testing.T, model string, gpus int, all bool) *Cluster {
	t.Helper()
	c, err := NewCluster(model, gpus, all)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func place(t *testing.T, st *State, p Policy, d Demand) []Alloc {
	t.Helper()
	as := p.Place(st, d)
	if as == nil {
		t.Fatalf("%s refused %+v", p.Name(), d)
	}
	st.Apply(as)
	if err := st.Check(); err != nil {
		t.Fatal(err)
	}
	return as
}

func at(start, size int) api.Placement { return api.Placement{Start: start, Size: size} }

func TestHAMiOneGPU(t *testing.T) {
	c := cluster(t, "A100-40GB", 1, false)
	st := NewState(c)
	one := Demand{Devices: 1, MemoryMiB: 4000}
	if a := place(t, st, HAMi{}, one)[0]; a.Profile != "1g.5gb" || a.Placement != at(6, 1) {
		t.Errorf("first 1g: %+v, want 1g.5gb at [6,7)", a)
	}
	if a := place(t, st, HAMi{}, one)[0]; a.Placement != at(5, 1) {
		t.Errorf("second 1g: %+v, want [5,6)", a)
	}
	if a := place(t, st, HAMi{}, Demand{Devices: 1, MemoryMiB: 9000})[0]; a.Profile != "2g.10gb" || a.Placement != at(0, 2) {
		t.Errorf("2g: %+v, want 2g.10gb at [0,2)", a)
	}
}

func TestHAMiSpread(t *testing.T) {
	c := cluster(t, "A100-40GB", 2, false)
	st := NewState(c)
	one := Demand{Devices: 1, MemoryMiB: 4000}
	// Empty GPUs tie: the highest index first; then the emptier GPU (spread).
	if a := place(t, st, HAMi{}, one)[0]; a.GPU != 1 || a.Placement != at(6, 1) {
		t.Errorf("first: %+v, want GPU 1 [6,7)", a)
	}
	if a := place(t, st, HAMi{}, one)[0]; a.GPU != 0 || a.Placement != at(6, 1) {
		t.Errorf("second: %+v, want GPU 0 [6,7)", a)
	}
	if a := place(t, st, HAMi{}, one)[0]; a.GPU != 1 || a.Placement != at(5, 1) {
		t.Errorf("third: %+v, want GPU 1 [5,6)", a)
	}
}

// TestHAMiLargerProfileSameGPU: when the smallest fitting profile has no free placement on
// the GPU tried first, a larger profile on that GPU wins before the next GPU. The shipped
// models' small placements tile their large ones, so the GPUs here publish a 1g profile with
// the single placement [0,1) (hand-made).
func TestHAMiLargerProfileSameGPU(t *testing.T) {
	c := cluster(t, "A100-40GB", 2, false)
	for i := range c.Nodes[0] {
		c.Nodes[0][i].MigProfiles = slices.Clone(c.Nodes[0][i].MigProfiles)
		c.Nodes[0][i].MigProfiles[0].Placements = []api.Placement{at(0, 1)}
	}
	c.profiles[0].Placements = []api.Placement{at(0, 1)}
	st := NewState(c)
	one := Demand{Devices: 1, MemoryMiB: 4000}
	// Empty GPUs tie: GPU 1 first, 1g at [0,1).
	if a := place(t, st, HAMi{}, one)[0]; a.GPU != 1 || a.Placement != at(0, 1) {
		t.Fatalf("first: %+v, want GPU 1 [0,1)", a)
	}
	// GPU 0 is emptier: its 1g at [0,1).
	if a := place(t, st, HAMi{}, one)[0]; a.GPU != 0 || a.Placement != at(0, 1) {
		t.Fatalf("second: %+v, want GPU 0 [0,1)", a)
	}
	// Both GPUs score alike: GPU 1 first; its 1g placement is taken, so 2g.10gb there
	// (ascending: [2,4)) rather than anything on GPU 0.
	if a := place(t, st, HAMi{}, one)[0]; a.GPU != 1 || a.Profile != "2g.10gb" || a.Placement != at(2, 2) {
		t.Fatalf("third: %+v, want 2g.10gb on GPU 1 at [2,4)", a)
	}
}

func TestFirstFitLowestStart(t *testing.T) {
	c := cluster(t, "A100-40GB", 2, false)
	st := NewState(c)
	one := Demand{Devices: 1, MemoryMiB: 4000}
	for want := range 7 {
		if a := place(t, st, FirstFit{}, one)[0]; a.GPU != 0 || a.Placement != at(want, 1) {
			t.Errorf("1g #%d: %+v, want GPU 0 [%d,%d)", want, a, want, want+1)
		}
	}
	if a := place(t, st, FirstFit{}, one)[0]; a.GPU != 1 || a.Placement != at(0, 1) {
		t.Errorf("8th 1g: %+v, want GPU 1 [0,1)", a)
	}
}

// TestPlacesAllHandCount: the exact search against counts done by hand on one A100-40GB.
func TestPlacesAllHandCount(t *testing.T) {
	c := cluster(t, "A100-40GB", 1, false)
	g3 := Demand{Devices: 1, MemoryMiB: 15000}
	g1 := Demand{Devices: 1, MemoryMiB: 4000}
	for _, tc := range []struct {
		name    string
		demands []Demand
		want    bool
	}{
		// 3g@4 + four 1g at 0..3; a second 3g leaves no room for the 1g (3g@0 + 3g@4).
		{"3g and four 1g", []Demand{g1, g3, g1, g1, g1}, true},
		{"two 3g and four 1g", []Demand{g3, g3, g1, g1, g1, g1}, false},
		{"two 3g", []Demand{g3, g3}, true},
		// Seven 1g placements, not eight.
		{"seven 1g", []Demand{g1, g1, g1, g1, g1, g1, g1}, true},
		{"eight 1g", []Demand{g1, g1, g1, g1, g1, g1, g1, g1}, false},
		// The whole GPU, or a 1g: not both.
		{"whole GPU", []Demand{{Devices: 1}}, true},
		{"whole GPU and 1g", []Demand{{Devices: 1}, g1}, false},
	} {
		ok, exact := PlacesAll(c, tc.demands, FillBudget)
		if ok != tc.want || !exact {
			t.Errorf("%s: PlacesAll %v (exact %v), want %v", tc.name, ok, exact, tc.want)
		}
	}
}

func TestParseTraceNamesLine(t *testing.T) {
	in := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n" +
		"a,1,1,1,500,,LS,Running,0,10,0\n" +
		"b,1,1,0,0,,LS,Running,0,10,0\n" +
		"c,1,1,x,0,,LS,Running,0,10,0\n"
	_, err := ParseTrace(strings.NewReader(in))
	if err == nil || !strings.Contains(err.Error(), "line 4") {
		t.Fatalf("error %v, want one naming line 4", err)
	}
	pods, err := ParseTrace(strings.NewReader(in[:strings.LastIndex(in[:len(in)-1], "\n")+1]))
	if err != nil || len(pods) != 1 || pods[0].Milli != 500 || pods[0].Line != 2 {
		t.Fatalf("pods %+v, err %v", pods, err)
	}
}

// TestSmoke runs every section at tiny sizes on the real traces, checking after every
// placement that each policy's reservations are legal and disjoint.
func TestSmoke(t *testing.T) {
	rep, err := Run(Config{TraceDir: "testdata/traces", MaxPods: 300, FillGPUs: 16, Orders: 3,
		QueueGPUs: []int{16}, QueueReplays: 2, QueuePods: 150, QueueLoad: 1, RelocatableShare: 0.5,
		DropGPUs: 10, DropLoads: []float64{0.5, 2}, StaticGPUs: 8, StaticPods: 10, StaticWindows: 2, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Inflation) != 8 || len(rep.Queue) != 8 || len(rep.Drop) != 4 || len(rep.Static) != 4 {
		t.Fatalf("%d inflation, %d queueing, %d drop, %d static panels", len(rep.Inflation), len(rep.Queue), len(rep.Drop), len(rep.Static))
	}
	for _, p := range rep.Inflation {
		for pi, runs := range p.Runs {
			for order, run := range runs {
				bound := min(p.Packing100[order], p.Capacity100[order])
				if run.At100 <= 0 || run.At100 > bound+1e-9 || run.At130 < run.At100 || run.At130 > p.Packing130[order]+1e-9 || len(run.Curve) != 26 {
					t.Errorf("inflation %s on %s, %s, order %d: %+v; bounds %.3f/%.3f/%.3f", p.Workload, p.Cluster, rep.Policies[pi], order, run,
						p.Capacity100[order], p.Packing100[order], p.Packing130[order])
				}
			}
		}
	}
	for _, p := range rep.Queue {
		if len(p.Relocating) != 2 {
			t.Errorf("queueing %s on %s: %d relocation replays, want 2", p.Workload, p.Cluster, len(p.Relocating))
		}
		for k, o := range p.Relocating {
			if o.Placed+o.Unplaceable != p.Pods {
				t.Errorf("queueing %s on %s, relocating, replay %d: %+v of %d pods", p.Workload, p.Cluster, k, o, p.Pods)
			}
		}
		for pi, runs := range p.Runs {
			for k, o := range runs {
				if o.Placed+o.Unplaceable != p.Pods || o.P95Wait < 0 || len(o.P95BySize) == 0 {
					t.Errorf("queueing %s on %s, %s, replay %d: %+v of %d pods", p.Workload, p.Cluster, rep.Policies[pi], k, o, p.Pods)
				}
			}
		}
	}
	for _, f := range rep.Static {
		for _, x := range f.Results {
			if x.Size == 0 {
				t.Errorf("%s on %s: an empty static-fill window at %d", f.Workload, f.Cluster, x.Window)
			}
			for name, placed := range x.Placed {
				if placed > x.Size {
					t.Errorf("%s placed %d of a %d-pod window", name, placed, x.Size)
				}
			}
		}
	}
	for _, p := range rep.Drop {
		for _, o := range p.Outcomes {
			if o.Arrived != p.Pods || o.Placed == 0 || o.Utilisation <= 0 || o.Utilisation > 1 {
				t.Errorf("%s on %s: %+v", p.Workload, p.Cluster, o)
			}
		}
	}
	var md, svg strings.Builder
	rep.WriteMarkdown(&md, Machine{Cores: 1, CPU: "test", Command: "test", At: "now"})
	rep.WriteSVG(&svg)
	for _, want := range []string{"Weng et al.", "## What holds", "## Inflation fill", "## Queueing replay", "## Static fill vs optimal", "## Secondary: drop-on-arrival replay", "hami-main", "per-GPU packing bound", "Relocation: the same replays", "Relocation (dynamig with relocation on"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report has no %q", want)
		}
	}
	if !strings.HasSuffix(svg.String(), "</svg>\n") {
		t.Error("plot incomplete")
	}
}

// TestHAMiDevicesStayOnGPU: a pod's devices go on the first GPU tried until it is full.
func TestHAMiDevicesStayOnGPU(t *testing.T) {
	st := NewState(cluster(t, "A100-40GB", 2, false))
	as := place(t, st, HAMi{}, Demand{Devices: 3, MemoryMiB: 9000})
	for i, a := range as {
		if a.GPU != 1 || a.Profile != "2g.10gb" || a.Placement != at(2*i, 2) {
			t.Errorf("device %d: %+v, want 2g.10gb on GPU 1 at [%d,%d)", i, a, 2*i, 2*i+2)
		}
	}
}

// TestHAMiMainScoring: on an empty A100 the first 1g goes where it leaves the longest free
// run ([0,1) leaves [1,8)), the second next to it; v2.10 would take [6,7) and [5,6).
func TestHAMiMainScoring(t *testing.T) {
	st := NewState(cluster(t, "A100-40GB", 1, false))
	one := Demand{Devices: 1, MemoryMiB: 4000}
	for _, want := range []api.Placement{at(0, 1), at(1, 1)} {
		if a := place(t, st, HAMiMain{}, one)[0]; a.Profile != "1g.5gb" || a.Placement != want {
			t.Errorf("1g: %+v, want 1g.5gb at %+v", a, want)
		}
	}
	// Two 3g devices: the 1g pair blocks [0,4), so one 3g fits; the pod of two goes nowhere.
	if as := (HAMiMain{}).Place(st, Demand{Devices: 2, MemoryMiB: 15000}); as != nil {
		t.Errorf("two 3g beside two 1g: %+v, want refused", as)
	}
}

// TestHAMiMainBacktrack: the search finds the most devices the GPU takes, within Count.
func TestHAMiMainBacktrack(t *testing.T) {
	c := cluster(t, "A100-40GB", 1, false)
	g := &NewState(c).Nodes[0][0]
	for _, tc := range []struct {
		name     string
		reserved []placement.Instance
		mem, n   int
		want     int
	}{
		{"two 3g on an empty GPU", nil, 15000, 2, 2},
		{"two 3g beside a 1g at 6", []placement.Instance{{Profile: "1g.5gb", Placement: at(6, 1)}}, 15000, 2, 1},
		{"eight 1g: seven placements", nil, 4000, 8, 7},
		{"four 2g: three placements", nil, 9000, 4, 3},
		{"a 2g beside 3g at 0 and 2g at 4", []placement.Instance{{Profile: "3g.20gb", Placement: at(0, 4)}, {Profile: "2g.10gb", Placement: at(4, 2)}}, 9000, 1, 0},
	} {
		g.MIG = tc.reserved
		u := useOf(g)
		if got := hamiMainBacktrack(c, g, &u, tc.mem, tc.n); len(got) != tc.want {
			t.Errorf("%s: %d devices %+v, want %d", tc.name, len(got), got, tc.want)
		}
	}
}

// TestPackingBoundHandCount: the per-GPU packing bound against counts done by hand.
func TestPackingBoundHandCount(t *testing.T) {
	g1, g2, g3 := Demand{Devices: 1, MemoryMiB: 4000}, Demand{Devices: 1, MemoryMiB: 9000}, Demand{Devices: 1, MemoryMiB: 15000}
	rep := func(d Demand, n int) []Demand { return slices.Repeat([]Demand{d}, n) }
	for _, tc := range []struct {
		name    string
		gpus    int
		demands []Demand
		slots   int
	}{
		{"eight 1g on one A100: seven placements", 1, rep(g1, 8), 7},
		{"four 2g: three placements", 1, rep(g2, 4), 6},
		{"three 2g and a 1g", 1, append(rep(g2, 3), g1), 7},
		{"two 3g", 1, rep(g3, 2), 8},
		{"a whole GPU and a 1g", 1, []Demand{{Devices: 1}, g1}, 8},
		{"fourteen 1g on two GPUs", 2, rep(g1, 14), 14},
		{"a 2-device whole-GPU pod on two GPUs, split", 2, []Demand{{Devices: 2}}, 16},
	} {
		c := cluster(t, "A100-40GB", tc.gpus, false)
		got, err := c.PackingBound(tc.demands)
		if err != nil {
			t.Fatal(err)
		}
		if want := float64(tc.slots) / float64(c.Capacity()); math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: bound %.4f, want %.4f", tc.name, got, want)
		}
	}
}

// TestInflateFigures: the fill's figures on one A100, by hand.
func TestInflateFigures(t *testing.T) {
	c := cluster(t, "A100-40GB", 1, false)
	g1, g2, g3 := Demand{Devices: 1, MemoryMiB: 4000}, Demand{Devices: 1, MemoryMiB: 9000}, Demand{Devices: 1, MemoryMiB: 15000}
	for _, tc := range []struct {
		name                    string
		offered                 []Demand
		at100, at130, first, st float64
	}{
		// 4 + 4 = 8 slots at 100 %; the 1g (9 ≤ 10.4) is refused with nothing free.
		{"two 3g then a 1g", []Demand{g3, g3, g1}, 1, 1, 1, 0},
		// Three 2g take [0,6); the fourth is refused; the 1g takes [6,7); [7,8) holds no 2g.
		{"four 2g", []Demand{g2, g2, g2, g2, g1}, 6.0 / 8, 7.0 / 8, 6.0 / 8, 1.0 / 8},
	} {
		run, err := Inflate(c, FirstFit{}, tc.offered, true)
		if err != nil {
			t.Fatal(err)
		}
		if run.At100 != tc.at100 || run.At130 != tc.at130 || run.FirstRefusal != tc.first || run.Stranded != tc.st {
			t.Errorf("%s: %+v, want at100 %.3f at130 %.3f first %.3f stranded %.3f", tc.name, run, tc.at100, tc.at130, tc.first, tc.st)
		}
	}
}

// TestQueueReplayWaits: a 1g arriving behind a whole-GPU pod waits for its departure.
func TestQueueReplayWaits(t *testing.T) {
	c := cluster(t, "A100-40GB", 1, false)
	jobs := []Job{
		{Demand: Demand{Devices: 1}, Arrive: 0, Depart: 10},
		{Demand: Demand{Devices: 1, MemoryMiB: 4000}, Arrive: 1, Depart: 2},
	}
	o, err := QueueReplay(c, FirstFit{}, jobs, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	// The 1g waits from 1 to 10.
	if o.Placed != 2 || o.MeanWait != 4.5 || o.P95Wait != 9 || o.P95BySize["1g"] != 9 || o.P95BySize["7g"] != 0 {
		t.Errorf("%+v", o)
	}
	// Pending from 1 (the last arrival) to 10 with the whole GPU in use: drain 100 %.
	if !math.IsNaN(o.UtilArrivals) || o.UtilDrain != 1 {
		t.Errorf("utilisation while pending: arrivals %v, drain %v; want NaN, 1", o.UtilArrivals, o.UtilDrain)
	}
	// One pod queued at the last arrival, pending 9 units after it.
	if o.PendingAtLast != 1 || o.DrainTime != 9 {
		t.Errorf("queue at last arrival %d, drain %v; want 1, 9", o.PendingAtLast, o.DrainTime)
	}
}

// TestDrainFollowsQueue: pairs with equal queues do not count; of the others, those where
// the longer queue had the higher drain utilisation do.
func TestDrainFollowsQueue(t *testing.T) {
	run := func(queue int, drain float64) []QueueOutcome {
		return []QueueOutcome{{PendingAtLast: queue, UtilDrain: drain}}
	}
	r := &Report{Queue: []QueuePanel{{Runs: [][]QueueOutcome{run(10, 0.8), run(20, 0.9), run(30, 0.85), run(30, 0.5)}}}}
	// Pairs with differing queues: (10,20) yes, (10,30a) yes, (10,30b) no, (20,30a) no, (20,30b) no.
	if c, n := r.drainFollowsQueue(); c != 2 || n != 5 {
		t.Errorf("%d of %d concordant; want 2 of 5", c, n)
	}
}

func TestPaired(t *testing.T) {
	p := pair([]float64{1, 2, 3, math.NaN()}, []float64{1, 1, 4, 0}, true)
	if p.N != 3 || p.Win != 1 || p.Tie != 1 || p.Loss != 1 || math.Abs(p.Mean) > 1e-12 {
		t.Errorf("%+v", p)
	}
	if w := pair([]float64{1, 1, 1}, []float64{2, 2, 2.5}, true); !w.Worse() {
		t.Errorf("%+v: dynamig lower on every input, not worse", w)
	}
	if w := pair([]float64{1, 1, 1}, []float64{2, 2, 2.5}, false); w.Worse() {
		t.Errorf("%+v: lower is better, not worse", w)
	}
}

// TestByChance: a comparison with no spread does not count; one of ten inputs with SE > 0
// is below −1 SE with probability P(t₉ < −1) ≈ 0.172, below −2 SE with ≈ 0.038.
func TestByChance(t *testing.T) {
	cs := []Comparison{{Paired: Paired{SE: 0, N: 10}}, {Paired: Paired{SE: 1, N: 10}}, {Paired: Paired{SE: 1, N: 10}}}
	if n, e := byChance(cs, 1); n != 2 || math.Abs(e-2*0.1718) > 0.001 {
		t.Errorf("k=1: %d comparisons, %.4f expected; want 2, 0.3436", n, e)
	}
	if _, e := byChance(cs, 2); math.Abs(e-2*0.0383) > 0.001 {
		t.Errorf("k=2: %.4f expected; want 0.0766", e)
	}
}

// TestQueueReplayRelocating: relocation's replay keeps the state consistent through every
// relocation (check), moves only relocatable single-device pods, each once, and with no
// relocatable pod is the plain replay.
func TestQueueReplayRelocating(t *testing.T) {
	c := cluster(t, "A100-40GB", 16, false)
	w := &Workload{Name: "inference", Mix: InferenceMix}
	jobs, err := w.Jobs(c, 1.0, 400, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, unit := w.TimeUnit()
	plain, err := QueueReplay(c, Dynamig{FragmentationAware: true}, jobs, unit, true)
	if err != nil {
		t.Fatal(err)
	}
	none, err := QueueReplayRelocating(c, jobs, unit, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if none.Relocated != 0 || none.MeanWait != plain.MeanWait || none.Placed != plain.Placed {
		t.Errorf("no relocatable pod: %+v, want the plain replay's %+v", none, plain)
	}
	half, err := QueueReplayRelocating(c, jobs, unit, 0.5, true)
	if err != nil {
		t.Fatal(err)
	}
	if half.Relocated == 0 || half.Placed != plain.Placed || half.RelocatedPerUnit <= 0 {
		t.Errorf("half relocatable: %d relocated, %d placed (%d plain), %v per unit", half.Relocated, half.Placed, plain.Placed, half.RelocatedPerUnit)
	}
	relocatables := 0
	for k, j := range jobs {
		if relocatable(k, 0.5) && j.Demand.Devices == 1 {
			relocatables++
		}
	}
	if half.Relocated > relocatables {
		t.Errorf("%d relocations of %d relocatable pods: one was moved twice", half.Relocated, relocatables)
	}
	t.Logf("mean wait %.3f → %.3f, utilisation while pending (arrivals) %.3f → %.3f, %d pods relocated", plain.MeanWait, half.MeanWait, plain.UtilArrivals, half.UtilArrivals, half.Relocated)
}

// BenchmarkQueueReplayRelocating is one relocating replay of the report's size (64 ×
// A100-40GB, 4000 pods of the inference mix), against the plain replay's cost.
func BenchmarkQueueReplayRelocating(b *testing.B) {
	c, err := NewCluster("A100-40GB", 64, false)
	if err != nil {
		b.Fatal(err)
	}
	w := &Workload{Name: "inference", Mix: InferenceMix}
	jobs, err := w.Jobs(c, 1.0, 4000, 1)
	if err != nil {
		b.Fatal(err)
	}
	_, unit := w.TimeUnit()
	for b.Loop() {
		if _, err := QueueReplayRelocating(c, jobs, unit, 0.5, false); err != nil {
			b.Fatal(err)
		}
	}
}

package packing

import (
	"slices"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/api"
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

// TestSmoke runs every experiment at tiny sizes on the real traces, checking after every
// placement that each policy's reservations are legal and disjoint.
func TestSmoke(t *testing.T) {
	rep, err := Run(Config{TraceDir: "testdata/traces", GPUs: 10, Loads: []float64{0.5, 2}, MaxPods: 300,
		SyntheticPods: 200, NoiseReplays: 2, FillGPUs: 8, FillPods: 10, FillWindows: 2, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Panels) != 8 || len(rep.Fill) != 4 || len(rep.Noise) != 2 {
		t.Fatalf("%d panels, %d fills, %d noise panels", len(rep.Panels), len(rep.Fill), len(rep.Noise))
	}
	for _, f := range rep.Fill {
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
	for _, p := range rep.Panels {
		for _, o := range p.Outcomes {
			if o.Arrived != p.Pods || o.Placed == 0 || o.Utilisation <= 0 || o.Utilisation > 1 {
				t.Errorf("%s on %s: %+v", p.Workload, p.Cluster, o)
			}
		}
	}
	var md, svg strings.Builder
	rep.WriteMarkdown(&md, Machine{Cores: 1, CPU: "test", Command: "test", At: "now"})
	rep.WriteSVG(&svg)
	if !strings.Contains(md.String(), "Weng et al.") || !strings.HasSuffix(svg.String(), "</svg>\n") {
		t.Error("report incomplete")
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

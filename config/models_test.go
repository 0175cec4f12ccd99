package config

import (
	"slices"
	"testing"
)

func TestModelTable(t *testing.T) {
	if got := len(Models()); got != 10 {
		t.Fatalf("models: got %d, want 10 (%v)", got, ModelKeys())
	}
	for _, m := range Models() {
		if m.FullProfile() == nil {
			t.Errorf("%s: no full-GPU profile", m.Key)
		}
		if got := m.CorePercent(m.FullProfile()); got != 100 {
			t.Errorf("%s: full profile core %d, want 100", m.Key, got)
		}
		for _, name := range m.NVMLNames {
			got, ok := LookupModel(name)
			if !ok || got.Key != m.Key {
				t.Errorf("LookupModel(%q) = %v, %v; want %s", name, got, ok, m.Key)
			}
		}
	}
}

func TestLookupModel(t *testing.T) {
	for _, tc := range []struct {
		name, want string // want "" means not found
	}{
		{"A100-40GB", "A100-40GB"},
		{"NVIDIA A100-PCIE-40GB", "A100-40GB"},
		{"nvidia a100-pcie-40gb", "A100-40GB"},
		{"A100-PCIE-40GB", "A100-40GB"},
		{"A100-40GB-PCIe", "A100-40GB"},
		{"NVIDIA H200", "H200-141GB"},
		{"H200-SXM5", "H200-141GB"},
		{"H200 NVL", "H200-141GB"},
		{"NVIDIA GH200 480GB", "GH200-96GB"},
		{"H100 on GH200", "GH200-96GB"},
		{"H20", "H20-96GB"},
		{"NVIDIA H20", "H20-96GB"},
		{"A30", "A30-24GB"},
		{"RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-Blackwell-Server"},
		// The NVML name without its vendor prefix is still equality, and picks the H200
		// only, never the GH200 whose name contains it.
		{"H200", "H200-141GB"},
		// Never by substring: these name no model.
		{"H100", ""},
		{"A100", ""},
		{"NVIDIA A100", ""},
		{"GH200", ""},
		{"", ""},
	} {
		m, ok := LookupModel(tc.name)
		switch {
		case tc.want == "" && ok:
			t.Errorf("LookupModel(%q) = %s, want no model", tc.name, m.Key)
		case tc.want != "" && (!ok || m.Key != tc.want):
			t.Errorf("LookupModel(%q) = %v, %v; want %s", tc.name, m, ok, tc.want)
		}
	}
}

func TestCorePercent(t *testing.T) {
	m, _ := LookupModel("A100-40GB")
	want := map[string]int{"1g.5gb": 15, "1g.5gb+me": 15, "1g.10gb": 15, "2g.10gb": 29, "3g.20gb": 43, "4g.20gb": 58, "7g.40gb": 100}
	for name, core := range want {
		p, ok := m.Profile(name)
		if !ok {
			t.Fatalf("no profile %s", name)
		}
		if got := m.CorePercent(p); got != core {
			t.Errorf("%s core: got %d, want %d", name, got, core)
		}
	}
}

func TestProfileAliases(t *testing.T) {
	m, _ := LookupModel("A100-80GB")
	a, ok1 := m.Profile("7g.79gb")
	b, ok2 := m.Profile("7g.80gb")
	if !ok1 || !ok2 || a != b {
		t.Fatalf("7g.79gb and 7g.80gb must name the same A100-80GB profile: %v %v", a, b)
	}
	h, _ := LookupModel("H100-80GB")
	if _, ok := h.Profile("7g.79gb"); ok {
		t.Errorf("7g.79gb is an A100-80GB alias only")
	}
}

func TestParseModelTableRejectsBadFacts(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":     "models:\n- model: X\n  colour: red\n",
		"bad profile name":  "models:\n- {model: X, nvmlNames: [X], memoryMiB: 1, sms: 1, slots: 1, maxInstances: 1, profiles: [{name: big, id: 0, instances: 1, memoryMiB: 1, sms: 1, placements: {starts: [0], size: 1}}]}\n",
		"placement outside": "models:\n- {model: X, nvmlNames: [X], memoryMiB: 1, sms: 1, slots: 1, maxInstances: 1, profiles: [{name: 1g.1gb, id: 0, instances: 1, memoryMiB: 1, sms: 1, placements: {starts: [1], size: 1}}]}\n",
		"no full profile":   "models:\n- {model: X, nvmlNames: [X], memoryMiB: 1, sms: 1, slots: 2, maxInstances: 1, profiles: [{name: 1g.1gb, id: 0, instances: 1, memoryMiB: 1, sms: 1, placements: {starts: [0], size: 1}}]}\n",
	} {
		if _, err := parseModelTable([]byte(doc)); err == nil {
			t.Errorf("%s: parsed without error", name)
		}
	}
}

func TestKnownModelNames(t *testing.T) {
	names := KnownModelNames()
	for _, want := range []string{"A100-40GB", "NVIDIA A100-PCIE-40GB", "NVIDIA H200"} {
		if !slices.Contains(names, want) {
			t.Errorf("KnownModelNames lacks %q", want)
		}
	}
}

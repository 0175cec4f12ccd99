package config

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/api"
)

// defaultAllowlist is docs/architecture.md's table, in the models' own profile names.
var defaultAllowlist = map[string][]string{
	"A30-24GB":                      {"1g.6gb", "2g.12gb", "4g.24gb"},
	"A100-40GB":                     {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"},
	"A100-80GB":                     {"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"},
	"H100-80GB":                     {"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"},
	"H100-94GB":                     {"1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb"},
	"H20-96GB":                      {"1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb"},
	"GH200-96GB":                    {"1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb"},
	"H200-141GB":                    {"1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"},
	"B200-180GB":                    {"1g.23gb", "2g.45gb", "3g.90gb", "7g.180gb"},
	"RTX-PRO-6000-Blackwell-Server": {"1g.24gb", "2g.48gb", "4g.96gb"},
}

func TestDefaultAllowlistMatchesEveryModel(t *testing.T) {
	cfg := DefaultDeviceConfig()
	for _, m := range Models() {
		want, ok := defaultAllowlist[m.Key]
		if !ok {
			t.Fatalf("model %s missing from the test's table", m.Key)
		}
		for _, name := range m.NVMLNames {
			got, ok := cfg.Nvidia.AllowedProfiles(name)
			if !ok || !reflect.DeepEqual(got, want) {
				t.Errorf("AllowedProfiles(%q) = %v, %v; want %v", name, got, ok, want)
			}
		}
		for _, name := range want {
			if _, ok := m.Profile(name); !ok {
				t.Errorf("%s: allowlisted profile %s not in the facts", m.Key, name)
			}
		}
	}
}

func TestAllowlistNeverMatchesBySubstring(t *testing.T) {
	cfg := DefaultDeviceConfig()
	// GH200's NVML name contains "H200" but must get the GH200 (H100 on GH200) profiles.
	got, _ := cfg.Nvidia.AllowedProfiles("NVIDIA GH200 480GB")
	if !reflect.DeepEqual(got, defaultAllowlist["GH200-96GB"]) {
		t.Errorf("GH200: got %v", got)
	}
	// An allowlist naming only "H200-SXM5" matches "NVIDIA H200" through the table.
	custom := NvidiaConfig{MigProfileAllowlist: []AllowlistEntry{{Models: []string{"H200-SXM5"}, Profiles: []string{"1g.18gb"}}}}
	if got, ok := custom.AllowedProfiles("NVIDIA H200"); !ok || !reflect.DeepEqual(got, []string{"1g.18gb"}) {
		t.Errorf("H200 SXM: got %v %v", got, ok)
	}
	if _, ok := custom.AllowedProfiles("NVIDIA GH200 480GB"); ok {
		t.Errorf("an H200 entry must not match the GH200")
	}
	// Unknown GPUs match by exact NVML name only.
	unknown := NvidiaConfig{MigProfileAllowlist: []AllowlistEntry{{Models: []string{"A800-SXM4-80GB"}, Profiles: []string{"1g.10gb"}}}}
	if _, ok := unknown.AllowedProfiles("NVIDIA A800-SXM4-80GB"); !ok {
		t.Errorf("exact NVML name of an unknown model should match")
	}
	if _, ok := unknown.AllowedProfiles("NVIDIA A800-SXM4-80GB-X"); ok {
		t.Errorf("a longer name must not match")
	}
}

func TestParseHAMiChartDeviceConfig(t *testing.T) {
	data, err := os.ReadFile("testdata/hami-chart-device-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseDeviceConfig(data)
	if err != nil {
		t.Fatalf("HAMi's chart output must parse: %v", err)
	}
	def := DefaultDeviceConfig()
	if !reflect.DeepEqual(cfg.Nvidia.MigProfileAllowlist, def.Nvidia.MigProfileAllowlist) {
		t.Errorf("allowlist differs from the defaults:\n%v\n%v", cfg.Nvidia.MigProfileAllowlist, def.Nvidia.MigProfileAllowlist)
	}
	cfg.Nvidia.LibCudaLogLevel = 0 // the chart sets it, the default leaves it
	if !reflect.DeepEqual(cfg.Nvidia, def.Nvidia) {
		t.Errorf("the chart's nvidia section differs from the defaults:\n%+v\n%+v", cfg.Nvidia, def.Nvidia)
	}
	if len(cfg.Warnings) != 0 {
		t.Errorf("warnings: %v", cfg.Warnings)
	}
}

func TestParseDeviceConfigDefaultsAndOverrides(t *testing.T) {
	cfg, err := ParseDeviceConfig([]byte(`
nvidia:
  resourceCountName: example.com/gpu
  deviceSplitCount: 4
  defaultMemory: 2048
  migProfileAllowlist:
  - models: [A100-80GB]
    profiles: [1g.10gb, 7g.79gb]
nodeconfig:
- name: gpu-1
  operatingmode: mig
  filterdevices:
    uuid: [GPU-aaaa]
    index: [3]
`))
	if err != nil {
		t.Fatal(err)
	}
	nv := cfg.Nvidia
	if nv.ResourceCountName != "example.com/gpu" || nv.ResourceMemoryName != api.ResourceMemory || nv.DeviceSplitCount != 4 ||
		nv.DefaultMemory != 2048 || nv.DeviceMemoryScaling != 1 || nv.DefaultGPUNum != 1 {
		t.Errorf("defaults not kept or overrides lost: %+v", nv)
	}
	if got, _ := nv.AllowedProfiles("NVIDIA A100-SXM4-80GB"); !reflect.DeepEqual(got, []string{"1g.10gb", "7g.80gb"}) {
		t.Errorf("7g.79gb must resolve to 7g.80gb: %v", got)
	}
	if _, ok := nv.AllowedProfiles("NVIDIA A100-PCIE-40GB"); ok {
		t.Errorf("a given allowlist replaces the default one")
	}
	n := cfg.Node("gpu-1")
	if n.OperatingMode != api.ModeMIG || !n.FilterDevices.Excludes("GPU-aaaa", 0) || !n.FilterDevices.Excludes("GPU-bbbb", 3) || n.FilterDevices.Excludes("GPU-bbbb", 1) {
		t.Errorf("node config: %+v", n)
	}
	if other := cfg.Node("other"); other.OperatingMode != "" || other.Name != "other" {
		t.Errorf("unnamed nodes follow their GPUs' MIG mode, got %+v", other)
	}
}

func TestParseDeviceConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []string // substrings of the error
	}{
		{"legacy knownMigGeometries", "nvidia:\n  knownMigGeometries:\n  - models: [A30]\n", []string{"nvidia.knownMigGeometries", "replace it with migProfileAllowlist"}},
		{"unknown field", "nvidia:\n  deviceSplitCont: 3\n", []string{"nvidia.deviceSplitCont", "unknown field", "deviceSplitCount"}},
		{"unknown top-level", "nvidai:\n  deviceSplitCount: 3\n", []string{"nvidai"}},
		{"unknown allowlist field", "nvidia:\n  migProfileAllowlist:\n  - modles: [A30]\n    profiles: [1g.6gb]\n", []string{"nvidia.migProfileAllowlist[0].modles"}},
		{"malformed profile", "nvidia:\n  migProfileAllowlist:\n  - models: [A30]\n    profiles: [1g.6gb, 2g12gb]\n", []string{"nvidia.migProfileAllowlist[0].profiles[1]", `"2g12gb"`}},
		{"profile of another model", "nvidia:\n  migProfileAllowlist:\n  - models: [A100-PCIE-40GB]\n    profiles: [1g.6gb]\n", []string{"nvidia.migProfileAllowlist[0].profiles[0]", "not a MIG profile of A100-40GB"}},
		{"empty models", "nvidia:\n  migProfileAllowlist:\n  - profiles: [1g.6gb]\n", []string{"nvidia.migProfileAllowlist[0].models: Required"}},
		{"unknown mode", "nodeconfig:\n- name: n1\n  operatingmode: vgpu\n", []string{"nodeconfig[0].operatingmode", `"vgpu"`}},
		{"mps mode", "nodeconfig:\n- name: n1\n  operatingmode: mps\n", []string{"nodeconfig[0].operatingmode", "MPS"}},
		{"duplicate node", "nodeconfig:\n- name: n1\n- name: n1\n", []string{`nodeconfig[1].name: Invalid value: "n1": this node is configured twice: also at nodeconfig[0]`}},
		{"node at top level and under nvidia", "nodeconfig:\n- name: n1\nnvidia:\n  nodeconfig:\n  - name: n0\n  - name: n1\n", []string{`nvidia.nodeconfig[1].name: Invalid value: "n1": this node is configured twice: also at nodeconfig[0]`}},
		{"nested unknown mode", "nvidia:\n  nodeconfig:\n  - name: n1\n    operatingmode: vgpu\n", []string{"nvidia.nodeconfig[0].operatingmode", `"vgpu"`}},
		{"nested filter uuid", "nvidia:\n  nodeconfig:\n  - name: n1\n    filterdevices:\n      uuid: [abc]\n", []string{"nvidia.nodeconfig[0].filterdevices.uuid[0]"}},
		{"bad type", "nvidia:\n  deviceSplitCount: ten\n", []string{"nvidia.deviceSplitCount", `"ten"`, "whole number"}},
		{"bad bool", "nvidia:\n  overwriteEnv: maybe\n", []string{"nvidia.overwriteEnv"}},
		{"list expected", "nvidia:\n  migProfileAllowlist: A30\n", []string{"nvidia.migProfileAllowlist", "must be a list"}},
		{"negative memory", "nvidia:\n  defaultMemory: -1\n", []string{"nvidia.defaultMemory"}},
		{"cores over 100", "nvidia:\n  defaultCores: 101\n", []string{"nvidia.defaultCores"}},
		{"split count 0", "nvidia:\n  deviceSplitCount: 0\n", []string{"nvidia.deviceSplitCount"}},
		{"scaling 0", "nvidia:\n  deviceMemoryScaling: 0\n", []string{"nvidia.deviceMemoryScaling"}},
		{"resource name", "nvidia:\n  resourceCountName: gpu\n", []string{"nvidia.resourceCountName", "domain-qualified"}},
		{"same resource twice", "nvidia:\n  resourceMemoryName: nvidia.com/gpu\n", []string{"nvidia.resourceMemoryName", "resourceCountName"}},
		{"filter uuid", "nodeconfig:\n- name: n1\n  filterdevices:\n    uuid: [abc]\n", []string{"nodeconfig[0].filterdevices.uuid[0]"}},
		{"not yaml", "nvidia: [\n", []string{"not valid YAML"}},
		{"duplicate key", "nvidia:\n  defaultCores: 1\n  defaultCores: 2\n", []string{"defaultCores"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseDeviceConfig([]byte(tc.doc))
			if err == nil {
				t.Fatalf("parsed without error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestUnknownAllowlistModelWarns(t *testing.T) {
	cfg, err := ParseDeviceConfig([]byte("nvidia:\n  migProfileAllowlist:\n  - models: [A800-SXM4-80GB]\n    profiles: [1g.10gb]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "A800-SXM4-80GB") {
		t.Errorf("warnings: %v", cfg.Warnings)
	}
}

func TestEmptyDeviceConfigIsDefaults(t *testing.T) {
	for _, doc := range []string{"", "# nothing\n", "nvidia:\n"} {
		cfg, err := ParseDeviceConfig([]byte(doc))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if !reflect.DeepEqual(cfg.Nvidia, DefaultDeviceConfig().Nvidia) {
			t.Errorf("%q: not the defaults", doc)
		}
	}
}

func FuzzParseDeviceConfig(f *testing.F) {
	if data, err := os.ReadFile("testdata/hami-chart-device-config.yaml"); err == nil {
		f.Add(data)
	}
	f.Add([]byte("nvidia:\n  knownMigGeometries: []\n"))
	f.Add([]byte("nodeconfig:\n- name: a\n  operatingmode: mig\n  filterdevices: {uuid: [GPU-1], index: [0]}\n"))
	f.Add([]byte("nvidia: {migProfileAllowlist: [{models: [A30], profiles: [1g.6gb]}]}"))
	f.Add([]byte("&a [*a]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseDeviceConfig(data)
		if err == nil && cfg == nil {
			t.Fatal("nil config without error")
		}
		if err != nil && err.Error() == "" {
			t.Fatal("empty error")
		}
	})
}

package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/api"
)

// TestNodeConfigForms: per-node settings at the top level, under nvidia (HAMi's dynamic-MIG
// documentation) and in a separate node config file (HAMi's device-plugin config.json) all
// apply, filterdevices included.
func TestNodeConfigForms(t *testing.T) {
	const node = `- name: n1
  operatingmode: mig
  filterdevices:
    uuid: [GPU-a]
    index: [1]
`
	indent := func(s, by string) string {
		return by + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n"+by) + "\n"
	}
	want := NodeConfig{Name: "n1", OperatingMode: api.ModeMIG, FilterDevices: FilterDevices{UUID: []string{"GPU-a"}, Index: []uint{1}}}
	for _, tc := range []struct {
		name, deviceConfig, nodeConfig string
	}{
		{name: "top level", deviceConfig: "nodeconfig:\n" + node},
		{name: "under nvidia", deviceConfig: "nvidia:\n  nodeconfig:\n" + indent(node, "  ")},
		{name: "node config file", deviceConfig: "nvidia:\n  deviceSplitCount: 5\n",
			nodeConfig: `{"nodeconfig": [{"name": "n1", "operatingmode": "mig", "filterdevices": {"uuid": ["GPU-a"], "index": [1]}}]}`},
		{name: "node config file as YAML", nodeConfig: "nodeconfig:\n" + node},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			devPath := filepath.Join(dir, "device-config.yaml")
			if err := os.WriteFile(devPath, []byte(tc.deviceConfig), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := LoadDeviceConfig(devPath)
			if err != nil {
				t.Fatal(err)
			}
			if tc.nodeConfig != "" {
				nodePath := filepath.Join(dir, "node-config.json")
				if err := os.WriteFile(nodePath, []byte(tc.nodeConfig), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := cfg.LoadNodeConfig(nodePath); err != nil {
					t.Fatal(err)
				}
			}
			got := cfg.Node("n1")
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Node(n1) = %+v, want %+v", got, want)
			}
			if !got.FilterDevices.Excludes("GPU-a", 0) || !got.FilterDevices.Excludes("GPU-b", 1) || got.FilterDevices.Excludes("GPU-b", 0) {
				t.Errorf("filterdevices: %+v", got.FilterDevices)
			}
			if len(cfg.Nvidia.NodeConfig) != 0 {
				t.Errorf("nvidia.nodeconfig is merged into NodeConfig, left %+v", cfg.Nvidia.NodeConfig)
			}
		})
	}
}

// TestNodeConfigConflicts: one node configured in two places is an error naming both.
func TestNodeConfigConflicts(t *testing.T) {
	dir := t.TempDir()
	devPath := filepath.Join(dir, "device-config.yaml")
	if err := os.WriteFile(devPath, []byte("nvidia:\n  nodeconfig:\n  - name: a\n  - name: b\n    operatingmode: mig\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, nodeConfig string
		want             []string
	}{
		{"same node in the file", `{"nodeconfig": [{"name": "c"}, {"name": "b", "operatingmode": "hami-core"}]}`,
			[]string{"node-config.json: invalid node config", `nodeconfig[1].name: Invalid value: "b": this node is configured twice: also at ` + devPath + ` nvidia.nodeconfig[1]`}},
		{"unknown field", `{"nodeconfig": [{"name": "c", "operatingmod": "mig"}]}`, []string{"nodeconfig[0].operatingmod", "unknown field"}},
		{"bad mode", `{"nodeconfig": [{"name": "c", "operatingmode": "MIG"}]}`, []string{"nodeconfig[0].operatingmode", `"MIG"`}},
		{"not a list", `{"nodeconfig": {"name": "c"}}`, []string{"nodeconfig", "must be a list"}},
		{"unknown top-level", `{"nodeconfigs": []}`, []string{"nodeconfigs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := LoadDeviceConfig(devPath)
			if err != nil {
				t.Fatal(err)
			}
			nodePath := filepath.Join(dir, "node-config.json")
			if err := os.WriteFile(nodePath, []byte(tc.nodeConfig), 0o600); err != nil {
				t.Fatal(err)
			}
			err = cfg.LoadNodeConfig(nodePath)
			if err == nil {
				t.Fatal("merged without error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	if err := DefaultDeviceConfig().LoadNodeConfig(filepath.Join(dir, "missing.json")); err == nil || !strings.Contains(err.Error(), "reading node config") {
		t.Errorf("a missing file: %v", err)
	}
}

// TestExampleDeviceConfig: the device ConfigMap content of HAMi's dynamic-MIG
// documentation, as examples/config holds it, parses and gives nodeB mig, nodeA hami-core;
// HAMi's device-plugin config.json merges in beside it.
func TestExampleDeviceConfig(t *testing.T) {
	cfg, err := LoadDeviceConfig("../examples/config/device-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if m := cfg.Node("nodeB").OperatingMode; m != api.ModeMIG {
		t.Errorf("nodeB: %q", m)
	}
	if m := cfg.Node("nodeA").OperatingMode; m != api.ModeHAMiCore {
		t.Errorf("nodeA: %q", m)
	}
	if err := cfg.LoadNodeConfig("../examples/config/node-config.json"); err != nil {
		t.Fatal(err)
	}
	if m := cfg.Node("MIG-NODE-A").OperatingMode; m != api.ModeMIG {
		t.Errorf("MIG-NODE-A: %q", m)
	}
	if len(cfg.Warnings) != 0 {
		t.Errorf("warnings: %v", cfg.Warnings)
	}
}

// TestAllowlistByVariant: an entry naming a card variant (HAMi's model strings, or an NVML
// name) applies to that variant alone; one naming the model key to every variant; the first
// entry that names the GPU wins.
func TestAllowlistByVariant(t *testing.T) {
	entry := func(model string, profiles ...string) AllowlistEntry {
		return AllowlistEntry{Models: []string{model}, Profiles: profiles}
	}
	for _, tc := range []struct {
		name    string
		entries []AllowlistEntry
		gpu     string
		want    []string // nil: no entry applies
	}{
		{"A100-40GB PCIe entry on the PCIe card", []AllowlistEntry{entry("A100-PCIE-40GB", "1g.5gb"), entry("A100-SXM4-40GB", "7g.40gb")}, "NVIDIA A100-PCIE-40GB", []string{"1g.5gb"}},
		{"A100-40GB PCIe entry does not shadow the SXM entry", []AllowlistEntry{entry("A100-PCIE-40GB", "1g.5gb"), entry("A100-SXM4-40GB", "7g.40gb")}, "NVIDIA A100-SXM4-40GB", []string{"7g.40gb"}},
		{"A100-40GB HAMi's other PCIe spelling", []AllowlistEntry{entry("A100-40GB-PCIe", "2g.10gb")}, "NVIDIA A100-PCIE-40GB", []string{"2g.10gb"}},
		{"A100-40GB PCIe entry alone, SXM card", []AllowlistEntry{entry("A100-PCIE-40GB", "1g.5gb")}, "NVIDIA A100-SXM4-40GB", nil},
		{"A100-40GB model key names every variant", []AllowlistEntry{entry("A100-40GB", "3g.20gb"), entry("A100-SXM4-40GB", "7g.40gb")}, "NVIDIA A100-SXM4-40GB", []string{"3g.20gb"}},
		{"A100-40GB exact NVML name", []AllowlistEntry{entry("NVIDIA A100-SXM4-40GB", "7g.40gb"), entry("A100-40GB", "1g.5gb")}, "NVIDIA A100-PCIE-40GB", []string{"1g.5gb"}},
		{"A100-80GB PCIe entry on the SXM card", []AllowlistEntry{entry("A100-PCIE-80GB", "1g.10gb"), entry("A100-SXM4-80GB", "7g.79gb")}, "NVIDIA A100-SXM4-80GB", []string{"7g.80gb"}},
		{"A100-80GB PCIe entry on the PCIe card", []AllowlistEntry{entry("A100-80GB-PCIe", "1g.10gb"), entry("A100-SXM4-80GB", "7g.79gb")}, "NVIDIA A100 80GB PCIe", []string{"1g.10gb"}},
		{"A100-80GB NVML name without the prefix", []AllowlistEntry{entry("A100 80GB PCIe", "2g.20gb")}, "NVIDIA A100 80GB PCIe", []string{"2g.20gb"}},
		{"H100 PCIe entry on the SXM card", []AllowlistEntry{entry("H100-PCIE-80GB", "1g.10gb"), entry("H100-SXM5-80GB", "7g.80gb")}, "NVIDIA H100 80GB HBM3", []string{"7g.80gb"}},
		{"H100 PCIe entry on the PCIe card", []AllowlistEntry{entry("H100-PCIE-80GB", "1g.10gb"), entry("H100-SXM5-80GB", "7g.80gb")}, "NVIDIA H100 PCIe", []string{"1g.10gb"}},
		{"H100 SXM entry alone, PCIe card", []AllowlistEntry{entry("H100-SXM5-80GB", "7g.80gb")}, "NVIDIA H100 PCIe", nil},
		{"H100-94GB NVL is HAMi's PCIe 94GB", []AllowlistEntry{entry("H100-SXM5-94GB", "7g.94gb"), entry("H100-PCIE-94GB", "1g.12gb")}, "NVIDIA H100 NVL", []string{"1g.12gb"}},
		{"H200 NVL entry on the SXM card", []AllowlistEntry{entry("H200 NVL", "1g.18gb"), entry("H200-SXM5", "7g.141gb")}, "NVIDIA H200", []string{"7g.141gb"}},
		{"H200 NVL entry on the NVL card", []AllowlistEntry{entry("H200 NVL", "1g.18gb"), entry("H200-SXM5", "7g.141gb")}, "NVIDIA H200 NVL", []string{"1g.18gb"}},
		{"H200 model key, both cards", []AllowlistEntry{entry("H200-141GB", "3g.71gb")}, "NVIDIA H200 NVL", []string{"3g.71gb"}},
		{"H200 never by substring", []AllowlistEntry{entry("H200-SXM5", "1g.18gb"), entry("H200 NVL", "1g.18gb")}, "NVIDIA GH200 480GB", nil},
		{"case is ignored", []AllowlistEntry{entry("a100-pcie-40gb", "1g.5gb")}, "NVIDIA A100-PCIE-40GB", []string{"1g.5gb"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := NvidiaConfig{MigProfileAllowlist: tc.entries}
			got, ok := cfg.AllowedProfiles(tc.gpu)
			if ok != (tc.want != nil) || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("AllowedProfiles(%q) = %v, %v; want %v", tc.gpu, got, ok, tc.want)
			}
		})
	}
}

func FuzzParseNodeConfig(f *testing.F) {
	if data, err := os.ReadFile("../examples/config/node-config.json"); err == nil {
		f.Add(data)
	}
	f.Add([]byte(`{"nodeconfig": [{"name": "a", "operatingmode": "mig"}, {"name": "a"}]}`))
	f.Add([]byte("nodeconfig:\n- name: b\n  filterdevices: {uuid: [GPU-1], index: [0]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseDeviceConfig([]byte("nodeconfig:\n- name: a\n"))
		if err != nil {
			t.Fatal(err)
		}
		before := len(cfg.NodeConfig)
		if err := cfg.ParseNodeConfig(data, "node-config.json"); err != nil {
			if !strings.HasPrefix(err.Error(), "node-config.json: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			if len(cfg.NodeConfig) != before {
				t.Fatalf("a refused node config was merged in part: %+v", cfg.NodeConfig)
			}
			return
		}
		names := map[string]bool{}
		for _, n := range cfg.NodeConfig {
			if names[n.Name] {
				t.Fatalf("node %q configured twice without an error", n.Name)
			}
			names[n.Name] = true
		}
		if len(cfg.NodeConfig) < before {
			t.Fatal("merging lost nodes")
		}
	})
}

// TestNodeConfigAfterCallerAppends: a node a caller appended itself (the sandbox does) is
// still found by a later node config file, and named by its index.
func TestNodeConfigAfterCallerAppends(t *testing.T) {
	cfg, err := ParseDeviceConfig([]byte("nodeconfig:\n- name: a\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.NodeConfig = append(cfg.NodeConfig, NodeConfig{Name: "b", OperatingMode: api.ModeMIG})
	err = cfg.ParseNodeConfig([]byte(`{"nodeconfig": [{"name": "c"}, {"name": "b"}]}`), "f.json")
	if err == nil || !strings.Contains(err.Error(), `nodeconfig[1].name: Invalid value: "b": this node is configured twice: also at nodeconfig[1]`) {
		t.Errorf("got %v", err)
	}
	if len(cfg.NodeConfig) != 2 {
		t.Errorf("a refused file changed the nodes: %+v", cfg.NodeConfig)
	}
	if err := cfg.ParseNodeConfig([]byte(`{"nodeconfig": [{"name": "c"}]}`), "f.json"); err != nil || cfg.Node("c").Name != "c" {
		t.Errorf("merge after a refusal: %v %+v", err, cfg.NodeConfig)
	}
}

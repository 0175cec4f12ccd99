package sandboxconfig

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
)

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
nodes:
- name: a
  mode: mig
  gpus: [A100-40GB, "NVIDIA H100 80GB HBM3"]
- name: b
  mode: hami-core
  gpus: [A30-24GB]
deviceConfig: dev.yaml
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Nodes) != 2 || cfg.Nodes[0].GPUs[1] != "NVIDIA H100 80GB HBM3" || cfg.DeviceConfig != "dev.yaml" {
		t.Errorf("parsed %+v", cfg)
	}
	def := DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Errorf("DefaultConfig: %v", err)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"unknown model", "nodes: [{name: a, mode: mig, gpus: [A100-41GB]}]", `nodes[0].gpus[0]: Unsupported value: "A100-41GB"`},
		{"known models listed", "nodes: [{name: a, mode: mig, gpus: [A100-41GB]}]", "A100-40GB"},
		{"unknown mode", "nodes: [{name: a, mode: mps, gpus: [A100-40GB]}]", `nodes[0].mode: Unsupported value: "mps": supported values: "mig", "hami-core"`},
		{"missing mode", "nodes: [{name: a, gpus: [A100-40GB]}]", "nodes[0].mode: Required value"},
		{"duplicate node", "nodes: [{name: a, mode: mig, gpus: [A100-40GB]}, {name: a, mode: mig, gpus: [A30]}]", `nodes[1].name: Duplicate value: "a"`},
		{"bad node name", "nodes: [{name: A_1, mode: mig, gpus: [A100-40GB]}]", "nodes[0].name: Invalid value"},
		{"no GPUs", "nodes: [{name: a, mode: mig}]", "nodes[0].gpus: Required value"},
		{"no nodes", "deviceConfig: x.yaml", "nodes: Required value"},
		{"empty", "", "nodes: Required value"},
		{"unknown field", "nodes: [{name: a, mode: mig, gpu: [A100-40GB]}]", `unknown field "gpu"`},
		{"wrong type", "nodes: {name: a}", "nodes: must be a list"},
		{"not YAML", "nodes: [", "not valid YAML"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestLoadConfigDeviceConfig(t *testing.T) {
	dir := t.TempDir()
	dev := `nvidia:
  deviceSplitCount: 4
  migProfileAllowlist:
  - models: ["A100-PCIE-40GB"]
    profiles: ["1g.5gb", "3g.20gb"]
nodeconfig:
- name: a
  operatingmode: hami-core
  devicesplitcount: 2
- name: elsewhere
  operatingmode: hami-core
`
	if err := os.WriteFile(filepath.Join(dir, "dev.yaml"), []byte(dev), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sandbox.yaml"), []byte("nodes: [{name: a, mode: mig, gpus: [A100-40GB]}, {name: b, mode: hami-core, gpus: [A30]}]\ndeviceConfig: dev.yaml\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(filepath.Join(dir, "sandbox.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DeviceConfig != filepath.Join(dir, "dev.yaml") {
		t.Errorf("deviceConfig %q is not relative to the config file", cfg.DeviceConfig)
	}
	merged, raw, err := cfg.DeviceConfigYAML()
	if err != nil {
		t.Fatal(err)
	}
	again, err := config.ParseDeviceConfig(raw)
	if err != nil {
		t.Fatalf("the written device config does not parse: %v\n%s", err, raw)
	}
	for _, c := range []*config.DeviceConfig{merged, again} {
		if c.Nvidia.DeviceSplitCount != 4 {
			t.Errorf("deviceSplitCount %d, want the user's 4", c.Nvidia.DeviceSplitCount)
		}
		if got, _ := c.Nvidia.AllowedProfiles("NVIDIA A100-PCIE-40GB"); !slices.Equal(got, []string{"1g.5gb", "3g.20gb"}) {
			t.Errorf("allowlist %v, want the user's", got)
		}
		a := c.Node("a")
		if a.OperatingMode != api.ModeMIG || a.DeviceSplitCount == nil || *a.DeviceSplitCount != 2 {
			t.Errorf("node a: %+v: want the sandbox's mode and the user's other settings", a)
		}
		if b := c.Node("b"); b.OperatingMode != api.ModeHAMiCore {
			t.Errorf("node b: %+v", b)
		}
		if e := c.Node("elsewhere"); e.OperatingMode != api.ModeHAMiCore {
			t.Errorf("node elsewhere: %+v", e)
		}
	}

	if err := os.WriteFile(filepath.Join(dir, "dev.yaml"), []byte("nvidia:\n  deviceSplitCount: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cfg.DeviceConfigYAML(); err == nil || !strings.Contains(err.Error(), "deviceConfig") || !strings.Contains(err.Error(), "deviceSplitCount") {
		t.Errorf("a bad device config: %v", err)
	}
}

// FuzzParseConfig: a sandbox config as a user writes it. Never a panic; what parses is valid.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("nodes:\n- name: a\n  mode: mig\n  gpus: [A100-40GB]\n"))
	f.Add([]byte(`{"nodes":[{"name":"b","mode":"hami-core","gpus":["A30-24GB","A30-24GB"]}],"deviceConfig":"d.yaml"}`))
	f.Add([]byte("nodes: [{name: A_1, mode: mps, gpus: []}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("parsed config is invalid: %v", err)
		}
	})
}

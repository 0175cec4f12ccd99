package app

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/nvml/sim"
)

func run(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = Main(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDiscoverExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		code      int
		errSubstr string
	}{
		{"sim json", []string{"discover", "--nvml=sim", "--sim-gpus=A100-40GB:1", "-o", "json"}, 0, ""},
		{"sim table", []string{"discover", "--nvml=sim", "--sim-gpus=A100-40GB:2,NVIDIA H200:1"}, 0, ""},
		{"unknown model", []string{"discover", "--nvml=sim", "--sim-gpus=A200:1"}, 2, "known models: A30-24GB"},
		{"bad count", []string{"discover", "--nvml=sim", "--sim-gpus=A100-40GB:x"}, 2, "A100-40GB:x"},
		{"sim without gpus", []string{"discover", "--nvml=sim"}, 2, "--nvml=sim needs --sim-gpus"},
		{"gpus without sim", []string{"discover", "--sim-gpus=A30"}, 2, "--sim-gpus and --sim-state need --nvml=sim"},
		{"state without sim", []string{"discover", "--sim-state=/tmp/x.json"}, 2, "--sim-gpus and --sim-state need --nvml=sim"},
		{"broken state", []string{"discover", "--nvml=sim", "--sim-gpus=A30", "--sim-state=testdata/broken-sim-state.json"}, 2, "testdata/broken-sim-state.json"},
		{"bad backend", []string{"discover", "--nvml=fake"}, 2, `--nvml must be "real" or "sim"`},
		{"bad output", []string{"discover", "--nvml=sim", "--sim-gpus=A30", "-o", "yaml"}, 2, "--output"},
		{"unknown flag", []string{"discover", "--bogus"}, 2, "unknown flag: --bogus"},
		{"extra arg", []string{"discover", "now"}, 2, ""},
		{"missing config", []string{"discover", "--nvml=sim", "--sim-gpus=A30", "--config=/nonexistent.yaml"}, 2, "/nonexistent.yaml"},
		{"run outside a cluster", []string{"run", "--nvml=sim", "--sim-gpus=A30", "--node-name=n1"}, 2, "in-cluster configuration"},
		{"run with a missing kubeconfig", []string{"run", "--nvml=sim", "--sim-gpus=A30", "--node-name=n1", "--kubeconfig=/nonexistent"}, 2, "/nonexistent"},
		{"run with a bad model", []string{"run", "--nvml=sim", "--sim-gpus=B300", "--node-name=n1", "--kubeconfig=/nonexistent"}, 2, ""},
		// No libnvidia-ml here: a runtime failure, exit 1, with a message that says what is missing.
		{"real without library", []string{"discover"}, 1, "libnvidia-ml.so.1 not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := run(tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.errSubstr) {
				t.Errorf("exit %d (want %d), stderr %q (want %q)", code, tc.code, stderr, tc.errSubstr)
			}
		})
	}
}

// TestDiscoverEveryModel is the acceptance check: for every model of the facts file, the
// JSON inventory lists exactly the default-allowlist profiles with the facts' memory and
// placements and core = ceil(SMs × 100 / full-GPU SMs).
func TestDiscoverEveryModel(t *testing.T) {
	for _, m := range config.Models() {
		t.Run(m.Key, func(t *testing.T) {
			code, stdout, stderr := run("discover", "--nvml=sim", "--sim-gpus="+m.Key+":1", "-o", "json")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			gpus, err := api.DecodeInventory(stdout)
			if err != nil {
				t.Fatalf("output is not a valid inventory: %v\n%s", err, stdout)
			}
			allowed, _ := config.DefaultDeviceConfig().Nvidia.AllowedProfiles(m.NVMLNames[0])
			full := m.FullProfile()
			var got []string
			for _, p := range gpus[0].MigProfiles {
				got = append(got, p.Name)
				want, _ := m.Profile(p.Name)
				if p.MemoryMB != want.MemoryMiB || p.Core != (want.SMs*100+full.SMs-1)/full.SMs ||
					!reflect.DeepEqual(p.Placements, want.Placements.List()) {
					t.Errorf("%s: %+v, facts %+v", p.Name, p, want)
				}
			}
			if !reflect.DeepEqual(got, allowed) || len(got) == 0 {
				t.Errorf("profiles %v, want %v", got, allowed)
			}
			if gpus[0].Type != m.NVMLNames[0] {
				t.Errorf("a model key simulates as its first NVML name: %q", gpus[0].Type)
			}
		})
	}
}

func TestDiscoverWithConfig(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/device-config.yaml"
	if err := os.WriteFile(path, []byte("nodeconfig:\n- name: core-node\n  operatingmode: hami-core\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run("discover", "--nvml=sim", "--sim-gpus=A100-40GB", "--config="+path, "--node-name=core-node", "-o", "json")
	if code != 0 {
		t.Fatal(stderr)
	}
	var gpus []api.GPU
	if err := json.Unmarshal([]byte(stdout), &gpus); err != nil || gpus[0].Mode != api.ModeHAMiCore || gpus[0].Count != 10 {
		t.Errorf("hami-core node: %v %+v", err, gpus)
	}
	if err := os.WriteFile(path, []byte("nvidia:\n  knownMigGeometries: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = run("discover", "--nvml=sim", "--sim-gpus=A100-40GB", "--config="+path)
	if code != 2 || !strings.Contains(stderr, "replace it with migProfileAllowlist") {
		t.Errorf("legacy config: exit %d %s", code, stderr)
	}
}

// TestDiscoverExampleDeviceConfig: the device ConfigMap content of HAMi's dynamic-MIG
// documentation (nodeconfig under nvidia), verbatim, gives nodeB mode mig and nodeA
// hami-core; HAMi's device-plugin config.json is taken by --node-config, and a node
// configured in both is refused naming both places.
func TestDiscoverExampleDeviceConfig(t *testing.T) {
	const devCfg, nodeCfg = "../../../examples/config/device-config.yaml", "../../../examples/config/node-config.json"
	for _, tc := range []struct {
		node, mode string
		args       []string
	}{
		{"nodeB", api.ModeMIG, nil},
		{"nodeA", api.ModeHAMiCore, nil},
		{"MIG-NODE-A", api.ModeMIG, []string{"--node-config=" + nodeCfg}},
	} {
		t.Run(tc.node, func(t *testing.T) {
			code, stdout, stderr := run(append([]string{"discover", "--nvml=sim", "--sim-gpus=A100-40GB", "--config=" + devCfg, "--node-name=" + tc.node, "-o", "json"}, tc.args...)...)
			if code != 0 {
				t.Fatal(stderr)
			}
			gpus, err := api.DecodeInventory(stdout)
			if err != nil || len(gpus) != 1 || gpus[0].Mode != tc.mode || gpus[0].Unusable != "" || gpus[0].Count == 0 {
				t.Errorf("%s: %v %+v", tc.node, err, gpus)
			}
		})
	}
	dir := t.TempDir()
	conflict := dir + "/node-config.json"
	if err := os.WriteFile(conflict, []byte(`{"nodeconfig": [{"name": "nodeB", "operatingmode": "hami-core"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := run("discover", "--nvml=sim", "--sim-gpus=A100-40GB", "--config="+devCfg, "--node-config="+conflict, "--node-name=nodeB")
	if code != 2 || !strings.Contains(stderr, `nodeconfig[0].name: Invalid value: "nodeB": this node is configured twice: also at `+devCfg+` nvidia.nodeconfig[1]`) {
		t.Errorf("conflict: exit %d, %s", code, stderr)
	}
}

func TestWithNVML(t *testing.T) {
	s, err := sim.New(sim.Options{Seed: "n"}, sim.GPUSpec{Model: "NVIDIA H200"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := MainContext(context.Background(), []string{"discover", "-o", "json"}, &out, &errOut, WithNVML(s)); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), `"type": "NVIDIA H200"`) {
		t.Errorf("the given library must be used: %s", out.String())
	}
	// The owner's library stays open after the command.
	if _, err := s.DeviceCount(); err != nil {
		t.Errorf("the command shut the given library down: %v", err)
	}
}

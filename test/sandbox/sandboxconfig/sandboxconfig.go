// Package sandboxconfig is the sandbox's world: its simulated nodes and device config, as a user
// writes them in a sandbox config file (dynamig-sandbox --config). It links no cluster code,
// so its decoder is fuzzed on its own.
package sandboxconfig

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
)

// Config is the sandbox's world: its simulated nodes and, optionally, a device-config.yaml
// whose settings every node's device plugin and the scheduler use.
type Config struct {
	Nodes []NodeConfig `json:"nodes"`
	// DeviceConfig is the path of a device-config.yaml (HAMi's device ConfigMap content);
	// "" is HAMi v2.10's defaults. Its nodeconfig is merged with the nodes' modes: a node's
	// mode always wins over that node's operatingmode there.
	DeviceConfig string `json:"deviceConfig"`
}

// NodeConfig is one simulated GPU node.
type NodeConfig struct {
	// Name is the Node's name.
	Name string `json:"name"`
	// Mode is the node's nodeconfig.operatingmode: "mig" or "hami-core".
	Mode string `json:"mode"`
	// GPUs are the simulated GPUs, one entry per GPU: a model key of the built-in table
	// (A100-40GB, which simulates as its first NVML name) or an NVML name
	// (NVIDIA A100-PCIE-40GB).
	GPUs []string `json:"gpus"`
	// RuntimeIgnoresCDI makes the node's container runtime drop CDI device names, as
	// containerd 1.7 with its default enable_cdi = false does (docs/troubleshooting.md).
	RuntimeIgnoresCDI bool `json:"runtimeIgnoresCDI,omitempty"`
	// NUMANodes splits the GPUs over that many NUMA nodes in index order, as evenly as they
	// go (4 GPUs on 2: 0, 0, 1, 1); 0 or 1: one NUMA node.
	NUMANodes int `json:"numaNodes,omitempty"`
}

// NUMANode is the NUMA node of the node's GPU i.
func (n *NodeConfig) NUMANode(i int) int {
	if n.NUMANodes <= 1 || len(n.GPUs) == 0 {
		return 0
	}
	return i * n.NUMANodes / len(n.GPUs)
}

// DefaultConfig is the seed's world: one mig node with an NVIDIA A100-PCIE-40GB and one
// hami-core node with an A100-40GB.
func DefaultConfig() Config {
	return Config{Nodes: []NodeConfig{
		{Name: "mig-node", Mode: api.ModeMIG, GPUs: []string{"NVIDIA A100-PCIE-40GB"}},
		{Name: "core-node", Mode: api.ModeHAMiCore, GPUs: []string{"A100-40GB"}},
	}}
}

// ParseConfig parses a sandbox config (YAML or JSON) and validates it. Unknown fields are
// errors; every error names its field, e.g. nodes[1].gpus[0].
func ParseConfig(data []byte) (*Config, error) {
	raw, err := utilyaml.ToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("sandbox config: not valid YAML: %w", err)
	}
	cfg := &Config{}
	if len(bytes.TrimSpace(raw)) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(cfg); err != nil {
			return nil, fmt.Errorf("sandbox config: %s", jsonError(err))
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// jsonError words encoding/json's errors with the field they are about.
func jsonError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if e, ok := err.(*json.UnmarshalTypeError); ok {
		typeErr = e
		return fmt.Sprintf("%s: must be %s, not a %s", typeErr.Field, typeName(typeErr.Type.String()), typeErr.Value)
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	return msg
}

func typeName(t string) string {
	switch {
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case t == "string":
		return "a string"
	case strings.HasPrefix(t, "sandbox."):
		return "a mapping"
	}
	return t
}

// LoadConfig reads and parses a sandbox config file. A relative deviceConfig path is
// relative to the file's directory.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if cfg.DeviceConfig != "" && !filepath.IsAbs(cfg.DeviceConfig) {
		cfg.DeviceConfig = filepath.Join(filepath.Dir(path), cfg.DeviceConfig)
	}
	return cfg, nil
}

// Validate checks the nodes: at least one, names valid and unique, a known mode, at least
// one GPU each and every GPU a known model.
func (c *Config) Validate() error {
	var errs field.ErrorList
	nodes := field.NewPath("nodes")
	if len(c.Nodes) == 0 {
		errs = append(errs, field.Required(nodes, "at least one node"))
	}
	seen := map[string]bool{}
	for i, n := range c.Nodes {
		p := nodes.Index(i)
		switch {
		case n.Name == "":
			errs = append(errs, field.Required(p.Child("name"), "the node's name"))
		case seen[n.Name]:
			errs = append(errs, field.Duplicate(p.Child("name"), n.Name))
		default:
			for _, msg := range validation.IsDNS1123Subdomain(n.Name) {
				errs = append(errs, field.Invalid(p.Child("name"), n.Name, msg))
			}
		}
		seen[n.Name] = true
		switch n.Mode {
		case api.ModeMIG, api.ModeHAMiCore:
		case "":
			errs = append(errs, field.Required(p.Child("mode"), fmt.Sprintf("%q or %q", api.ModeMIG, api.ModeHAMiCore)))
		default:
			errs = append(errs, field.NotSupported(p.Child("mode"), n.Mode, []string{api.ModeMIG, api.ModeHAMiCore}))
		}
		if len(n.GPUs) == 0 {
			errs = append(errs, field.Required(p.Child("gpus"), "at least one GPU (a model key or NVML name)"))
		}
		if n.NUMANodes < 0 || n.NUMANodes > max(len(n.GPUs), 1) {
			errs = append(errs, field.Invalid(p.Child("numaNodes"), n.NUMANodes, fmt.Sprintf("must be between 0 and the number of GPUs (%d)", len(n.GPUs))))
		}
		for j, g := range n.GPUs {
			if _, ok := config.LookupModel(g); !ok {
				errs = append(errs, field.NotSupported(p.Child("gpus").Index(j), g, config.KnownModelNames()))
			} else if strings.Contains(g, ",") {
				errs = append(errs, field.Invalid(p.Child("gpus").Index(j), g, "must not contain a comma"))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("sandbox config: %w", errs.ToAggregate())
	}
	return nil
}

// DeviceConfigYAML is the device config the sandbox hands to the scheduler and to every
// node's device plugin: the user's (or the defaults) with a nodeconfig entry per sandbox
// node whose operatingmode is the node's mode. It returns the YAML to write.
func (c *Config) DeviceConfigYAML() (*config.DeviceConfig, []byte, error) {
	cfg, err := config.LoadDeviceConfig(c.DeviceConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox config: deviceConfig: %w", err)
	}
	for _, n := range c.Nodes {
		found := false
		for i := range cfg.NodeConfig {
			if cfg.NodeConfig[i].Name == n.Name {
				cfg.NodeConfig[i].OperatingMode = n.Mode
				found = true
			}
		}
		if !found {
			cfg.NodeConfig = append(cfg.NodeConfig, config.NodeConfig{Name: n.Name, OperatingMode: n.Mode})
		}
	}
	// JSON is YAML: the device plugin and the scheduler parse it as device-config.yaml.
	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	merged, err := config.ParseDeviceConfig(out)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox config: the merged device config does not parse: %w", err)
	}
	return merged, out, nil
}

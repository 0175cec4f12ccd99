package config

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dynamig/dynamig/api"
)

// DeviceConfig is the content of the device ConfigMap's device-config.yaml, as HAMi's chart
// writes it. Only the nvidia section and nodeconfig are interpreted; the other vendors'
// sections are accepted so that a HAMi ConfigMap can be used as it is.
type DeviceConfig struct {
	Nvidia NvidiaConfig `json:"nvidia"`
	// NodeConfig holds every node's settings, from wherever they were written: the top level,
	// nvidia.nodeconfig, and a node config file (LoadNodeConfig).
	NodeConfig []NodeConfig `json:"nodeconfig"`
	// nodeOrigins says where each NodeConfig entry was written, for the error that names
	// both places of a node configured twice.
	nodeOrigins []string

	Cambricon any `json:"cambricon"`
	Hygon     any `json:"hygon"`
	Metax     any `json:"metax"`
	Enflame   any `json:"enflame"`
	Mthreads  any `json:"mthreads"`
	Iluvatars any `json:"iluvatars"`
	Kunlun    any `json:"kunlun"`
	AWSNeuron any `json:"awsneuron"`
	AMD       any `json:"amd"`
	Vastai    any `json:"vastai"`
	Biren     any `json:"biren"`
	Vnpus     any `json:"vnpus"`

	// Warnings are findings that are not errors, e.g. an allowlist model that matches no
	// GPU of the built-in table. Callers log them.
	Warnings []string `json:"-"`
}

// NvidiaConfig is the nvidia section. Fields HAMi's chart writes that dynamig does not use
// are accepted and kept.
type NvidiaConfig struct {
	ResourceNames        `json:",inline"`
	ResourcePriorityName string `json:"resourcePriorityName"`
	// DefaultMemory is the MiB per device of a request that names neither gpumem nor
	// gpumem-percentage; 0 means the whole device (on MIG, the full-GPU profile).
	DefaultMemory int `json:"defaultMemory"`
	// DefaultCores is the gpucores percentage of a request that names none (HAMi applies it
	// the same way): on hami-core the share's SM limit, on MIG the least SM share of the
	// profile; 100 makes every such share exclusive.
	DefaultCores int `json:"defaultCores"`
	// DefaultGPUNum is the nvidia.com/gpu count the webhook gives a container that asks for
	// gpumem, gpumem-percentage or gpucores in its limits without one, as HAMi's does; 0
	// gives none, and such a container is refused.
	DefaultGPUNum       int     `json:"defaultGPUNum"`
	DeviceSplitCount    int     `json:"deviceSplitCount"`
	DeviceMemoryScaling float64 `json:"deviceMemoryScaling"`
	DeviceCoreScaling   float64 `json:"deviceCoreScaling"`
	// MigProfileAllowlist names the MIG profiles each GPU model may be split into; the first
	// entry whose models match a GPU applies.
	MigProfileAllowlist []AllowlistEntry `json:"migProfileAllowlist"`

	OverwriteEnv              bool   `json:"overwriteEnv"`
	PreConfiguredDeviceMemory int    `json:"preConfiguredDeviceMemory"`
	MemoryFactor              int    `json:"memoryFactor"`
	EnableNumaTopology        bool   `json:"enableNumaTopology"`
	GPUCorePolicy             string `json:"gpuCorePolicy"`
	LibCudaLogLevel           int    `json:"libCudaLogLevel"`
	RuntimeClassName          string `json:"runtimeClassName"`
	MigStrategy               string `json:"migstrategy"`
	DisableCoreLimit          string `json:"disablecorelimit"`
	// NodeConfig here is how HAMi's dynamic-MIG documentation writes per-node settings; it is
	// merged into DeviceConfig.NodeConfig when parsed, and is empty after.
	NodeConfig []NodeConfig `json:"nodeconfig,omitempty"`
}

// AllowlistEntry allows profiles on the GPU models it names. A model is a key of the
// built-in table, one of its NVML names, or one of HAMi's model strings.
type AllowlistEntry struct {
	Models   []string `json:"models"`
	Profiles []string `json:"profiles"`
}

// NodeConfig is a per-node setting, as in HAMi's device-plugin config.
type NodeConfig struct {
	Name string `json:"name"`
	// OperatingMode is "hami-core" or "mig". Empty follows each GPU's MIG mode: mig where
	// it is on, hami-core where it is off (HAMi takes hami-core regardless; a GPU in MIG mode
	// cannot serve hami-core pods, so following the hardware is the only useful default).
	OperatingMode string `json:"operatingmode"`
	// FilterDevices lists GPUs the device plugin leaves alone.
	FilterDevices FilterDevices `json:"filterdevices"`

	DeviceMemoryScaling *float64 `json:"devicememoryscaling"`
	DeviceCoreScaling   *float64 `json:"devicecorescaling"`
	DeviceSplitCount    *int     `json:"devicesplitcount"`
	MigStrategy         string   `json:"migstrategy"`

	// Accepted as HAMi's chart writes them (its default nodeConfiguration.config has all
	// three); dynamig does not act on them.
	PreConfiguredDeviceMemory    *int  `json:"preconfigureddevicememory"`
	EnableNumaTopology           *bool `json:"enablenumatopology"`
	EnableGetPreferredAllocation *bool `json:"enablegetpreferredallocation"`
}

// FilterDevices names GPUs by UUID or NVML index.
type FilterDevices struct {
	UUID  []string `json:"uuid"`
	Index []uint   `json:"index"`
}

// Excludes reports whether the GPU is filtered out.
func (f *FilterDevices) Excludes(uuid string, index int) bool {
	return slices.Contains(f.UUID, uuid) || (index >= 0 && slices.Contains(f.Index, uint(index)))
}

// DefaultDeviceConfig is HAMi v2.10's device-config.yaml as its chart ships it.
func DefaultDeviceConfig() *DeviceConfig {
	return &DeviceConfig{Nvidia: NvidiaConfig{
		ResourceNames:        DefaultResourceNames(),
		ResourcePriorityName: api.ResourcePriority,
		DefaultMemory:        0,
		DefaultCores:         0,
		DefaultGPUNum:        1,
		DeviceSplitCount:     10,
		DeviceMemoryScaling:  1,
		DeviceCoreScaling:    1,
		MemoryFactor:         1,
		GPUCorePolicy:        "default",
		MigProfileAllowlist:  DefaultMigProfileAllowlist(),
	}}
}

// DefaultMigProfileAllowlist is the allowlist HAMi v2.10 ships (docs/architecture.md's table).
func DefaultMigProfileAllowlist() []AllowlistEntry {
	return []AllowlistEntry{
		{Models: []string{"A30"}, Profiles: []string{"1g.6gb", "2g.12gb", "4g.24gb"}},
		{Models: []string{"A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"}, Profiles: []string{"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"}},
		{Models: []string{"A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"}, Profiles: []string{"1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb"}},
		{Models: []string{"H100-PCIE-80GB", "H100-SXM5-80GB"}, Profiles: []string{"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"}},
		{Models: []string{"H100-PCIE-94GB", "H100-SXM5-94GB"}, Profiles: []string{"1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb"}},
		{Models: []string{"H20", "H100 on GH200"}, Profiles: []string{"1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb"}},
		{Models: []string{"H200 NVL", "H200-SXM5"}, Profiles: []string{"1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"}},
		{Models: []string{"B200"}, Profiles: []string{"1g.23gb", "2g.45gb", "3g.90gb", "7g.180gb"}},
		{Models: []string{"RTX PRO 6000 Blackwell Server Edition"}, Profiles: []string{"1g.24gb", "2g.48gb", "4g.96gb"}},
	}
}

// ParseDeviceConfig parses device-config.yaml over the defaults and validates it. Every
// error names its field path, e.g. nvidia.migProfileAllowlist[1].profiles[0]. Per-node
// settings may stand at the top level (nodeconfig) or in the nvidia section
// (nvidia.nodeconfig, as HAMi's dynamic-MIG documentation writes them); a node named in both
// is an error naming both places.
func ParseDeviceConfig(data []byte) (*DeviceConfig, error) {
	return parseDeviceConfig(data, "")
}

// parseDeviceConfig is ParseDeviceConfig; file, when known, prefixes the places recorded
// for a later node config file's conflict errors.
func parseDeviceConfig(data []byte, file string) (*DeviceConfig, error) {
	cfg := DefaultDeviceConfig()
	errs := decodeYAML(data, cfg)
	if len(errs) == 0 {
		top, nested := cfg.NodeConfig, cfg.Nvidia.NodeConfig
		cfg.NodeConfig, cfg.Nvidia.NodeConfig = nil, nil
		errs = cfg.validate()
		errs = append(errs, cfg.addNodes(file, field.NewPath("nodeconfig"), top)...)
		errs = append(errs, cfg.addNodes(file, field.NewPath("nvidia", "nodeconfig"), nested)...)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid device config: %w", errs.ToAggregate())
	}
	return cfg, nil
}

// LoadDeviceConfig reads and parses a device-config.yaml file; an empty path gives the
// defaults.
func LoadDeviceConfig(path string) (*DeviceConfig, error) {
	if path == "" {
		return DefaultDeviceConfig(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading device config: %w", err)
	}
	cfg, err := parseDeviceConfig(data, path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// nodeConfigFile is HAMi's device-plugin config (the hami-device-plugin ConfigMap's
// config.json): per-node settings only.
type nodeConfigFile struct {
	NodeConfig []NodeConfig `json:"nodeconfig"`
}

// ParseNodeConfig parses HAMi's device-plugin node config, {"nodeconfig": [...]} (JSON, or
// the same as YAML), and merges its nodes into c. A node that c already configures is an
// error naming both places; file names the input in errors.
func (c *DeviceConfig) ParseNodeConfig(data []byte, file string) error {
	var nc nodeConfigFile
	errs := decodeYAML(data, &nc)
	n := len(c.NodeConfig)
	if len(errs) == 0 {
		errs = c.addNodes(file, field.NewPath("nodeconfig"), nc.NodeConfig)
	}
	if len(errs) > 0 {
		c.NodeConfig, c.nodeOrigins = c.NodeConfig[:n], c.nodeOrigins[:min(n, len(c.nodeOrigins))] // all or nothing
		return fmt.Errorf("%s: invalid node config: %w", file, errs.ToAggregate())
	}
	return nil
}

// LoadNodeConfig reads a node config file (--node-config) and merges it into c, as
// ParseNodeConfig does; an empty path changes nothing.
func (c *DeviceConfig) LoadNodeConfig(path string) error {
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading node config: %w", err)
	}
	return c.ParseNodeConfig(data, path)
}

// origin says where NodeConfig[j] was written; an entry a caller appended itself has none.
func (c *DeviceConfig) origin(j int) string {
	if j < len(c.nodeOrigins) && c.nodeOrigins[j] != "" {
		return c.nodeOrigins[j]
	}
	return fmt.Sprintf("nodeconfig[%d]", j)
}

// addNodes validates the nodes written at path (in file, if known) and adds them to c.
func (c *DeviceConfig) addNodes(file string, path *field.Path, nodes []NodeConfig) field.ErrorList {
	errs := validateNodeConfig(path, nodes)
	for i, n := range nodes {
		where := path.Index(i).String()
		if file != "" {
			where = file + " " + where
		}
		if j := slices.IndexFunc(c.NodeConfig, func(o NodeConfig) bool { return n.Name != "" && o.Name == n.Name }); j >= 0 {
			errs = append(errs, field.Invalid(path.Index(i).Child("name"), n.Name, "this node is configured twice: also at "+c.origin(j)))
			continue
		}
		for len(c.nodeOrigins) < len(c.NodeConfig) { // entries a caller appended itself
			c.nodeOrigins = append(c.nodeOrigins, "")
		}
		c.nodeOrigins = append(c.nodeOrigins, where)
		c.NodeConfig = append(c.NodeConfig, n)
	}
	return errs
}

func (c *DeviceConfig) validate() field.ErrorList {
	nv, p := &c.Nvidia, field.NewPath("nvidia")
	errs := nv.ResourceNames.validate(p)
	if nv.DefaultMemory < 0 {
		errs = append(errs, field.Invalid(p.Child("defaultMemory"), nv.DefaultMemory, "must not be negative (MiB; 0 means the whole device)"))
	}
	if nv.DefaultCores < 0 || nv.DefaultCores > 100 {
		errs = append(errs, field.Invalid(p.Child("defaultCores"), nv.DefaultCores, "must be a percentage in 0..100"))
	}
	if nv.DefaultGPUNum < 0 {
		errs = append(errs, field.Invalid(p.Child("defaultGPUNum"), nv.DefaultGPUNum, "must not be negative"))
	}
	if nv.DeviceSplitCount < 1 {
		errs = append(errs, field.Invalid(p.Child("deviceSplitCount"), nv.DeviceSplitCount, "must be at least 1"))
	}
	if nv.DeviceMemoryScaling <= 0 {
		errs = append(errs, field.Invalid(p.Child("deviceMemoryScaling"), nv.DeviceMemoryScaling, "must be positive"))
	}
	if nv.DeviceCoreScaling <= 0 {
		errs = append(errs, field.Invalid(p.Child("deviceCoreScaling"), nv.DeviceCoreScaling, "must be positive"))
	}
	if !slices.Contains([]string{"", "default", "force", "disable"}, nv.GPUCorePolicy) {
		errs = append(errs, field.NotSupported(p.Child("gpuCorePolicy"), nv.GPUCorePolicy, []string{"default", "force", "disable"}))
	}
	allowErrs, warnings := validateAllowlist(p.Child("migProfileAllowlist"), nv.MigProfileAllowlist)
	errs = append(errs, allowErrs...)
	c.Warnings = append(c.Warnings, warnings...)
	return errs
}

func validateAllowlist(path *field.Path, entries []AllowlistEntry) (field.ErrorList, []string) {
	var errs field.ErrorList
	var warnings []string
	for i, e := range entries {
		p := path.Index(i)
		if len(e.Models) == 0 {
			errs = append(errs, field.Required(p.Child("models"), "at least one GPU model"))
		}
		if len(e.Profiles) == 0 {
			errs = append(errs, field.Required(p.Child("profiles"), "at least one MIG profile"))
		}
		var known []*Model
		for j, name := range e.Models {
			m, ok := LookupModel(name)
			switch {
			case strings.TrimSpace(name) == "":
				errs = append(errs, field.Required(p.Child("models").Index(j), "a GPU model name"))
			case !ok:
				warnings = append(warnings, fmt.Sprintf("%s: %q is not a GPU model of the built-in table; it matches only a GPU whose NVML name is exactly that (known: %s)",
					p.Child("models").Index(j), name, strings.Join(KnownModelNames(), ", ")))
			default:
				known = append(known, m)
			}
		}
		for j, prof := range e.Profiles {
			pp := p.Child("profiles").Index(j)
			if _, err := api.ParseProfileName(prof); err != nil {
				errs = append(errs, field.Invalid(pp, prof, err.Error()))
				continue
			}
			for _, m := range known {
				if _, ok := m.Profile(prof); !ok {
					errs = append(errs, field.Invalid(pp, prof, fmt.Sprintf("not a MIG profile of %s (its profiles: %s)", m.Key, strings.Join(m.ProfileNames(), ", "))))
				}
			}
		}
	}
	return errs, warnings
}

func validateNodeConfig(path *field.Path, nodes []NodeConfig) field.ErrorList {
	var errs field.ErrorList
	for i, n := range nodes {
		p := path.Index(i)
		if n.Name == "" {
			errs = append(errs, field.Required(p.Child("name"), "the node's name"))
		}
		switch n.OperatingMode {
		case "", api.ModeHAMiCore, api.ModeMIG:
		case "mps":
			errs = append(errs, field.Invalid(p.Child("operatingmode"), n.OperatingMode, "MPS sharing is not supported by dynamig; use \"hami-core\" or \"mig\""))
		default:
			errs = append(errs, field.NotSupported(p.Child("operatingmode"), n.OperatingMode, []string{api.ModeHAMiCore, api.ModeMIG}))
		}
		if n.DeviceSplitCount != nil && *n.DeviceSplitCount < 1 {
			errs = append(errs, field.Invalid(p.Child("devicesplitcount"), *n.DeviceSplitCount, "must be at least 1"))
		}
		if n.DeviceMemoryScaling != nil && *n.DeviceMemoryScaling <= 0 {
			errs = append(errs, field.Invalid(p.Child("devicememoryscaling"), *n.DeviceMemoryScaling, "must be positive"))
		}
		if n.DeviceCoreScaling != nil && *n.DeviceCoreScaling <= 0 {
			errs = append(errs, field.Invalid(p.Child("devicecorescaling"), *n.DeviceCoreScaling, "must be positive"))
		}
		for j, uuid := range n.FilterDevices.UUID {
			if !strings.HasPrefix(uuid, "GPU-") {
				errs = append(errs, field.Invalid(p.Child("filterdevices", "uuid").Index(j), uuid, "must be a GPU UUID (GPU-…)"))
			}
		}
	}
	return errs
}

// Node returns the node's settings; a node that nodeconfig does not name gets the
// defaults: mode from each GPU's MIG mode, nothing filtered.
func (c *DeviceConfig) Node(name string) NodeConfig {
	for _, n := range c.NodeConfig {
		if n.Name == name {
			return n
		}
	}
	return NodeConfig{Name: name}
}

// AllowedProfiles returns the profile names the allowlist allows on a GPU of that NVML
// name, from the first entry with a model that names the GPU (NamesGPU: a model key names
// every variant, a HAMi model string or NVML name one variant; never by substring); ok is
// false when no entry does. Aliases are mapped to the model's own names (7g.79gb → 7g.80gb
// on A100-80GB).
func (c *NvidiaConfig) AllowedProfiles(nvmlName string) (profiles []string, ok bool) {
	gpuModel, known := LookupModel(nvmlName)
	for _, e := range c.MigProfileAllowlist {
		if !slices.ContainsFunc(e.Models, func(name string) bool { return NamesGPU(name, nvmlName) }) {
			continue
		}
		for _, prof := range e.Profiles {
			if known {
				prof = gpuModel.CanonicalProfileName(prof)
			}
			profiles = append(profiles, prof)
		}
		return profiles, true
	}
	return nil, false
}

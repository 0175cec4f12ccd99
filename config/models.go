package config

import (
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/dynamig/dynamig/api"
)

// migHardwareYAML is mig-hardware.yaml beside this file, the MIG facts per GPU model: the
// one copy in the repository (nvml/sim's tests check the simulator against it).
//
//go:embed mig-hardware.yaml
var migHardwareYAML []byte

// Model is one GPU model of the built-in table.
type Model struct {
	// Key names the model in this project ("A100-40GB").
	Key string `json:"model"`
	// NVMLNames are the names NVML reports for it; a key simulates as the first.
	NVMLNames    []string  `json:"nvmlNames"`
	MemoryMiB    int       `json:"memoryMiB"`
	SMs          int       `json:"sms"`
	Slots        int       `json:"slots"`
	MaxInstances int       `json:"maxInstances"`
	Confirmed    bool      `json:"confirmed"`
	Profiles     []Profile `json:"profiles"`
}

// Profile is one GPU-instance profile of a model.
type Profile struct {
	Name string `json:"name"`
	// ID is the NVML profile id (GpuInstanceProfileInfo.Id), which every call after
	// discovery takes.
	ID int `json:"id"`
	// NVMLIndex is the GPU_INSTANCE_PROFILE_* index passed to GetGpuInstanceProfileInfo.
	NVMLIndex  int          `json:"nvmlIndex"`
	Instances  int          `json:"instances"`
	MemoryMiB  int          `json:"memoryMiB"`
	SMs        int          `json:"sms"`
	Placements PlacementSet `json:"placements"`
	Confirmed  bool         `json:"confirmed"`
}

// PlacementSet is a profile's legal placements: every start, one size.
type PlacementSet struct {
	Starts []int `json:"starts"`
	Size   int   `json:"size"`
}

// List expands the set into placements in start order.
func (s PlacementSet) List() []api.Placement {
	out := make([]api.Placement, len(s.Starts))
	for i, start := range s.Starts {
		out[i] = api.Placement{Start: start, Size: s.Size}
	}
	return out
}

// Name parses the profile's name; the table is validated at load, so this cannot fail.
func (p *Profile) ParsedName() api.ProfileName {
	n, _ := api.ParseProfileName(p.Name)
	return n
}

// FullProfile is the model's full-GPU profile: the variant-free profile spanning every slot.
// Percentages of memory and cores are taken of it.
func (m *Model) FullProfile() *Profile {
	for i := range m.Profiles {
		p := &m.Profiles[i]
		if p.Placements.Size == m.Slots && p.ParsedName().Variant == "" {
			return p
		}
	}
	return nil
}

// CorePercent is the profile's SM share of the full-GPU profile, rounded up:
// ceil(SMs × 100 / full-GPU SMs).
func (m *Model) CorePercent(p *Profile) int {
	full := m.FullProfile()
	if full == nil || full.SMs == 0 {
		return 0
	}
	return (p.SMs*100 + full.SMs - 1) / full.SMs
}

// Profile returns the model's profile of that name; see CanonicalProfileName for aliases.
func (m *Model) Profile(name string) (*Profile, bool) {
	name = m.CanonicalProfileName(name)
	for i := range m.Profiles {
		if m.Profiles[i].Name == name {
			return &m.Profiles[i], true
		}
	}
	return nil, false
}

// ProfileByID returns the model's profile with that NVML profile id.
func (m *Model) ProfileByID(id int) (*Profile, bool) {
	for i := range m.Profiles {
		if m.Profiles[i].ID == id {
			return &m.Profiles[i], true
		}
	}
	return nil, false
}

// profileAliases are other spellings of a model's profiles. HAMi's default allowlist names
// the A100-80GB full-GPU profile 7g.79gb; NVML calls it 7g.80gb.
var profileAliases = map[string]map[string]string{
	"A100-80GB": {"7g.79gb": "7g.80gb"},
}

// CanonicalProfileName maps an alias to the model's own profile name.
func (m *Model) CanonicalProfileName(name string) string {
	if canonical, ok := profileAliases[m.Key][name]; ok {
		return canonical
	}
	return name
}

// ProfileNames lists the model's profile names in table order.
func (m *Model) ProfileNames() []string {
	out := make([]string, len(m.Profiles))
	for i := range m.Profiles {
		out[i] = m.Profiles[i].Name
	}
	return out
}

// hamiModelNames are the model strings of HAMi's default allowlist. Each names one card
// variant of a model of the table, here by the NVML name that variant reports, so an
// allowlist entry naming "A100-PCIE-40GB" does not apply to an A100-SXM4-40GB (HAMi keeps
// them apart too). Matching is by equality, never by substring: "H200" is inside
// "NVIDIA GH200 480GB". An empty variant is a card the table has no NVML name for; such a
// string matches no GPU.
var hamiModelNames = map[string]hamiModel{
	"A100-SXM4-40GB":                        {"A100-40GB", "NVIDIA A100-SXM4-40GB"},
	"A100-40GB-PCIe":                        {"A100-40GB", "NVIDIA A100-PCIE-40GB"},
	"A100-PCIE-40GB":                        {"A100-40GB", "NVIDIA A100-PCIE-40GB"},
	"A100-SXM4-80GB":                        {"A100-80GB", "NVIDIA A100-SXM4-80GB"},
	"A100-80GB-PCIe":                        {"A100-80GB", "NVIDIA A100 80GB PCIe"},
	"A100-PCIE-80GB":                        {"A100-80GB", "NVIDIA A100 80GB PCIe"},
	"H100-PCIE-80GB":                        {"H100-80GB", "NVIDIA H100 PCIe"},
	"H100-SXM5-80GB":                        {"H100-80GB", "NVIDIA H100 80GB HBM3"},
	"H100-PCIE-94GB":                        {"H100-94GB", "NVIDIA H100 NVL"},
	"H100-SXM5-94GB":                        {"H100-94GB", ""},
	"H20":                                   {"H20-96GB", "NVIDIA H20"},
	"H100 on GH200":                         {"GH200-96GB", "NVIDIA GH200 480GB"},
	"H200 NVL":                              {"H200-141GB", "NVIDIA H200 NVL"},
	"H200-SXM5":                             {"H200-141GB", "NVIDIA H200"},
	"B200":                                  {"B200-180GB", "NVIDIA B200"},
	"RTX PRO 6000 Blackwell Server Edition": {"RTX-PRO-6000-Blackwell-Server", "NVIDIA RTX PRO 6000 Blackwell Server Edition"},
	"A30":                                   {"A30-24GB", "NVIDIA A30"},
}

// hamiModel is what one of HAMi's model strings names: a model key and the variant's NVML
// name.
type hamiModel struct{ key, variant string }

type modelTable struct {
	models []Model
	// byName maps every lower-cased key, NVML name (with and without "NVIDIA ") and HAMi
	// model string to its model.
	byName map[string]*Model
	// byKey maps the lower-cased model keys alone; hami the lower-cased HAMi strings.
	byKey map[string]*Model
	hami  map[string]hamiModel
}

var loadModels = sync.OnceValues(func() (*modelTable, error) {
	return parseModelTable(migHardwareYAML)
})

func parseModelTable(data []byte) (*modelTable, error) {
	var facts struct {
		SlotLayouts map[string]map[string]PlacementSet `json:"slotLayouts"`
		Models      []Model                            `json:"models"`
	}
	if errs := decodeYAML(data, &facts); len(errs) > 0 {
		return nil, fmt.Errorf("MIG hardware facts: %w", errs.ToAggregate())
	}
	t := &modelTable{models: facts.Models, byName: map[string]*Model{}, byKey: map[string]*Model{}, hami: map[string]hamiModel{}}
	for i := range t.models {
		m := &t.models[i]
		if err := validateModel(m); err != nil {
			return nil, fmt.Errorf("MIG hardware facts, model %s: %w", m.Key, err)
		}
		t.byKey[strings.ToLower(m.Key)] = m
		names := []string{m.Key}
		for _, n := range m.NVMLNames {
			names = append(names, n, strings.TrimPrefix(n, "NVIDIA "))
		}
		for _, n := range names {
			t.byName[strings.ToLower(n)] = m
		}
	}
	for hami, hm := range hamiModelNames {
		m, ok := t.byKey[strings.ToLower(hm.key)]
		if !ok {
			return nil, fmt.Errorf("HAMi model name %q maps to unknown model %q", hami, hm.key)
		}
		if hm.variant != "" && !slices.Contains(m.NVMLNames, hm.variant) {
			return nil, fmt.Errorf("HAMi model name %q names variant %q, not an NVML name of %s", hami, hm.variant, m.Key)
		}
		t.byName[strings.ToLower(hami)] = m
		t.hami[strings.ToLower(hami)] = hm
	}
	return t, nil
}

func validateModel(m *Model) error {
	if len(m.NVMLNames) == 0 || m.Slots <= 0 || m.MaxInstances <= 0 || m.SMs <= 0 || m.MemoryMiB <= 0 {
		return fmt.Errorf("needs nvmlNames, slots, maxInstances, sms and memoryMiB")
	}
	ids := map[int]bool{}
	for _, p := range m.Profiles {
		if _, err := api.ParseProfileName(p.Name); err != nil {
			return err
		}
		if ids[p.ID] {
			return fmt.Errorf("profile %s: duplicate id %d", p.Name, p.ID)
		}
		ids[p.ID] = true
		for _, pl := range p.Placements.List() {
			if !pl.Within(m.Slots) {
				return fmt.Errorf("profile %s: placement %s outside %d slots", p.Name, pl, m.Slots)
			}
		}
		if p.Instances <= 0 || p.MemoryMiB <= 0 || p.SMs <= 0 {
			return fmt.Errorf("profile %s: needs instances, memoryMiB and sms", p.Name)
		}
	}
	if m.FullProfile() == nil {
		return fmt.Errorf("no full-GPU profile (a variant-free profile of size %d)", m.Slots)
	}
	return nil
}

func mustModels() *modelTable {
	t, err := loadModels()
	if err != nil {
		panic(err) // the embedded table is tested; this is a build defect
	}
	return t
}

// Models lists the built-in GPU models in table order.
func Models() []Model { return mustModels().models }

// ModelKeys lists the model keys in table order.
func ModelKeys() []string {
	var keys []string
	for _, m := range Models() {
		keys = append(keys, m.Key)
	}
	return keys
}

// LookupModel finds a model by key, NVML name (with or without the "NVIDIA " prefix) or one
// of HAMi's model strings, case-insensitively and by equality only.
func LookupModel(name string) (*Model, bool) {
	m, ok := mustModels().byName[strings.ToLower(strings.TrimSpace(name))]
	return m, ok
}

// NamesGPU reports whether an allowlist model string names a GPU of that NVML name. A model
// key ("A100-40GB") names every variant of the model; one of HAMi's model strings
// ("A100-PCIE-40GB") or an NVML name ("NVIDIA A100-PCIE-40GB", with or without "NVIDIA ")
// names that variant alone. Case is ignored; substrings never match.
func NamesGPU(model, nvmlName string) bool {
	t, key := mustModels(), strings.ToLower(strings.TrimSpace(model))
	if m, ok := t.byKey[key]; ok {
		gpu, known := LookupModel(nvmlName)
		return known && gpu == m
	}
	if hm, ok := t.hami[key]; ok {
		return hm.variant != "" && sameNVMLName(hm.variant, nvmlName)
	}
	return sameNVMLName(model, nvmlName)
}

func sameNVMLName(a, b string) bool {
	trim := func(s string) string { return strings.TrimPrefix(strings.TrimSpace(s), "NVIDIA ") }
	return strings.EqualFold(trim(a), trim(b))
}

// KnownModelNames lists the keys and NVML names, for error messages.
func KnownModelNames() []string {
	var out []string
	for _, m := range Models() {
		out = append(out, m.Key)
		out = append(out, m.NVMLNames...)
	}
	return slices.Compact(out)
}

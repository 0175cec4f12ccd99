package api

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// GPU is one entry of the node inventory annotation (hami.io/node-nvidia-register). Field
// names follow HAMi v2.10's DeviceInfo, and so does omitempty except on index and numa,
// whose 0 is a value (HAMi's decoders read an absent one as 0 too); MigProfiles, Model,
// Slots and Unusable are additions that HAMi's tools ignore.
type GPU struct {
	// ID is the GPU UUID ("GPU-…").
	ID    string `json:"id,omitempty"`
	Index uint   `json:"index"`
	// Count is the number of devices the GPU offers: MIG, its most concurrent instances;
	// hami-core, deviceSplitCount.
	Count int `json:"count,omitempty"`
	// Devmem is the memory in MiB: MIG, the full-GPU profile's; hami-core, the card's
	// (scaled by deviceMemoryScaling).
	Devmem  int `json:"devmem,omitempty"`
	Devcore int `json:"devcore,omitempty"`
	// Type is the NVML name, e.g. "NVIDIA A100-PCIE-40GB".
	Type   string `json:"type,omitempty"`
	Numa   int    `json:"numa"`
	Mode   string `json:"mode,omitempty"`
	Health bool   `json:"health,omitempty"`
	// MigProfiles lists the allowlisted profiles that NVML reports, MIG GPUs only.
	MigProfiles []MigProfile `json:"migProfiles,omitempty"`
	// Model is the key of the built-in model table ("A100-40GB"), empty if unknown.
	Model string `json:"model,omitempty"`
	// Slots is the number of memory slots placements are counted in (8, 4 or 12).
	Slots int `json:"slots,omitempty"`
	// Unusable says why the GPU cannot serve pods in its mode (a hami-core GPU with MIG mode
	// on, a MIG GPU with MIG mode off); such a GPU offers no devices (count 0).
	Unusable string `json:"unusable,omitempty"`
	// Unexplained lists the MIG instances on the GPU that no live reservation explains and
	// that the device plugin keeps (made by someone else, or still running processes after
	// their pod ended): the scheduler treats their placements as taken.
	Unexplained []Instance `json:"unexplainedInstances,omitempty"`
}

// Instance is a MIG instance by its profile and placement.
type Instance struct {
	Profile   string    `json:"profile"`
	Placement Placement `json:"placement"`
}

// MigProfile is one GPU-instance profile a MIG GPU offers.
type MigProfile struct {
	Name     string `json:"name,omitempty"`
	MemoryMB int    `json:"memoryMB,omitempty"`
	// Core is ceil(profile SMs × 100 / full-GPU profile SMs).
	Core       int         `json:"core,omitempty"`
	SliceCount int         `json:"sliceCount,omitempty"`
	Placements []Placement `json:"placements,omitempty"`
	// Instances is the profile's NVML InstanceCount: how many may exist at once.
	Instances int `json:"instances,omitempty"`
}

// LargestDeviceMiB is the most memory one device of the GPU can have: its largest
// published MIG profile's, or a hami-core GPU's device memory.
func (g *GPU) LargestDeviceMiB() int {
	if g.Mode != ModeMIG {
		return g.Devmem
	}
	largest := 0
	for _, p := range g.MigProfiles {
		largest = max(largest, p.MemoryMB)
	}
	return largest
}

// SlotCount is the number of memory slots of the GPU: Slots when published, else the end
// of its furthest placement (the full-GPU profile spans them all).
func (g *GPU) SlotCount() int {
	if g.Slots > 0 {
		return g.Slots
	}
	n := 0
	for _, p := range g.MigProfiles {
		for _, pl := range p.Placements {
			n = max(n, pl.End())
		}
	}
	return n
}

// Profile returns the published profile of that name.
func (g *GPU) Profile(name string) (*MigProfile, bool) {
	for i := range g.MigProfiles {
		if g.MigProfiles[i].Name == name {
			return &g.MigProfiles[i], true
		}
	}
	return nil, false
}

// HasPlacement reports whether pl is one of the profile's legal placements.
func (p *MigProfile) HasPlacement(pl Placement) bool {
	for _, legal := range p.Placements {
		if legal == pl {
			return true
		}
	}
	return false
}

var inventoryPath = field.NewPath(NodeInventoryAnnotation)

// DecodeInventory decodes and validates a node inventory annotation.
func DecodeInventory(raw string) ([]GPU, error) {
	gpus, errs := decodeArray[GPU](inventoryPath, raw)
	if len(errs) == 0 {
		errs = ValidateInventory(gpus)
	}
	return gpus, errs.ToAggregate()
}

// EncodeInventory validates and encodes a node inventory.
func EncodeInventory(gpus []GPU) (string, error) {
	if err := ValidateInventory(gpus).ToAggregate(); err != nil {
		return "", err
	}
	if gpus == nil {
		gpus = []GPU{}
	}
	b, err := json.Marshal(gpus)
	return string(b), err
}

// ValidateInventory checks a node inventory for internal consistency.
func ValidateInventory(gpus []GPU) field.ErrorList {
	var errs field.ErrorList
	ids, indexes := sets.New[string](), sets.New[uint]()
	for i := range gpus {
		g, p := &gpus[i], inventoryPath.Index(i)
		switch {
		case g.ID == "":
			errs = append(errs, field.Required(p.Child("id"), "the GPU UUID"))
		case ids.Has(g.ID):
			errs = append(errs, field.Duplicate(p.Child("id"), g.ID))
		}
		ids.Insert(g.ID)
		if indexes.Has(g.Index) {
			errs = append(errs, field.Duplicate(p.Child("index"), g.Index))
		}
		indexes.Insert(g.Index)
		errs = append(errs, nonNegative(p.Child("count"), g.Count)...)
		errs = append(errs, nonNegative(p.Child("devmem"), g.Devmem)...)
		errs = append(errs, nonNegative(p.Child("devcore"), g.Devcore)...)
		errs = append(errs, nonNegative(p.Child("slots"), g.Slots)...)
		switch g.Mode {
		case ModeMIG:
		case ModeHAMiCore:
			if len(g.MigProfiles) > 0 {
				errs = append(errs, field.Forbidden(p.Child("migProfiles"), "only GPUs of mode \"mig\" list MIG profiles"))
			}
		default:
			errs = append(errs, field.NotSupported(p.Child("mode"), g.Mode, []string{ModeMIG, ModeHAMiCore}))
		}
		errs = append(errs, validateProfiles(p.Child("migProfiles"), g.MigProfiles, g.SlotCount())...)
		for j, in := range g.Unexplained {
			q := p.Child("unexplainedInstances").Index(j)
			if g.Mode != ModeMIG {
				errs = append(errs, field.Forbidden(q, "only GPUs of mode \"mig\" hold MIG instances"))
			}
			if _, err := ParseProfileName(in.Profile); err != nil {
				errs = append(errs, field.Invalid(q.Child("profile"), in.Profile, err.Error()))
			}
			if !in.Placement.Within(g.SlotCount()) {
				errs = append(errs, field.Invalid(q.Child("placement"), in.Placement.String(), fmt.Sprintf("must lie inside the GPU's %d memory slots", g.SlotCount())))
			}
		}
	}
	return errs
}

func validateProfiles(path *field.Path, profiles []MigProfile, slots int) field.ErrorList {
	var errs field.ErrorList
	names := sets.New[string]()
	for i := range profiles {
		prof, p := &profiles[i], path.Index(i)
		if _, err := ParseProfileName(prof.Name); err != nil {
			errs = append(errs, field.Invalid(p.Child("name"), prof.Name, err.Error()))
		} else if names.Has(prof.Name) {
			errs = append(errs, field.Duplicate(p.Child("name"), prof.Name))
		}
		names.Insert(prof.Name)
		if prof.MemoryMB <= 0 {
			errs = append(errs, field.Invalid(p.Child("memoryMB"), prof.MemoryMB, "must be positive"))
		}
		if prof.Core <= 0 || prof.Core > 100 {
			errs = append(errs, field.Invalid(p.Child("core"), prof.Core, "must be in 1..100"))
		}
		if prof.SliceCount <= 0 {
			errs = append(errs, field.Invalid(p.Child("sliceCount"), prof.SliceCount, "must be positive"))
		}
		errs = append(errs, nonNegative(p.Child("instances"), prof.Instances)...)
		if len(prof.Placements) == 0 {
			errs = append(errs, field.Required(p.Child("placements"), "a MIG profile needs at least one legal placement"))
		}
		for j, pl := range prof.Placements {
			if !pl.Within(slots) {
				errs = append(errs, field.Invalid(p.Child("placements").Index(j), pl.String(),
					fmt.Sprintf("must lie inside the GPU's %d memory slots", slots)))
			}
		}
	}
	return errs
}

func nonNegative(path *field.Path, v int) field.ErrorList {
	if v < 0 {
		return field.ErrorList{field.Invalid(path, v, "must not be negative")}
	}
	return nil
}

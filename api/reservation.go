package api

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// MigReservation is one record of the pod annotation hami.io/vgpu-mig-allocations: one MIG
// device of one container. The scheduler writes ContainerIndex, DeviceIndex, GPUUUID, Profile
// and Placement; the device plugin adds MigUUID, GPUInstanceID and ComputeInstanceID, all
// three or none, after it created the instance.
type MigReservation struct {
	// ContainerIndex counts spec.initContainers, then spec.containers.
	ContainerIndex int       `json:"containerIndex"`
	DeviceIndex    int       `json:"deviceIndex"`
	GPUUUID        string    `json:"gpuUUID"`
	Profile        string    `json:"profile"`
	Placement      Placement `json:"placement"`

	MigUUID           string  `json:"migUUID,omitempty"`
	GPUInstanceID     *uint32 `json:"gpuInstanceID,omitempty"`
	ComputeInstanceID *uint32 `json:"computeInstanceID,omitempty"`
}

// ReservationKey identifies a reservation within its pod.
type ReservationKey struct {
	ContainerIndex, DeviceIndex int
}

// Key is the record's (containerIndex, deviceIndex).
func (r *MigReservation) Key() ReservationKey {
	return ReservationKey{ContainerIndex: r.ContainerIndex, DeviceIndex: r.DeviceIndex}
}

// Realized reports whether the device plugin has written the runtime identity.
func (r *MigReservation) Realized() bool {
	return r.MigUUID != "" && r.GPUInstanceID != nil && r.ComputeInstanceID != nil
}

// SetRuntime records the runtime identity of the realised instance.
func (r *MigReservation) SetRuntime(migUUID string, gpuInstanceID, computeInstanceID uint32) {
	r.MigUUID, r.GPUInstanceID, r.ComputeInstanceID = migUUID, &gpuInstanceID, &computeInstanceID
}

var reservationsPath = field.NewPath(MigReservationsAnnotation)

// MaxDevicesPerPod bounds the GPU devices of one pod, so its reservations: a pod's devices
// are on one node, and a node holds at most 16 GPUs of at most 7 MIG instances each (112).
// Validation compares records pairwise, so no annotation may make it costly.
const MaxDevicesPerPod = 128

// DecodeMigReservations decodes and validates a pod's MIG reservations annotation.
func DecodeMigReservations(raw string) ([]MigReservation, error) {
	recs, errs := decodeArray[MigReservation](reservationsPath, raw)
	if len(recs) > MaxDevicesPerPod {
		return nil, field.ErrorList{field.TooMany(reservationsPath, len(recs), MaxDevicesPerPod)}.ToAggregate()
	}
	if len(errs) == 0 {
		errs = ValidateMigReservations(recs)
	}
	return recs, errs.ToAggregate()
}

// EncodeMigReservations validates the records and encodes them in (containerIndex,
// deviceIndex) order, so equal reservations always encode to equal bytes (and signatures).
func EncodeMigReservations(recs []MigReservation) (string, error) {
	if err := ValidateMigReservations(recs).ToAggregate(); err != nil {
		return "", err
	}
	sorted := slices.Clone(recs)
	SortMigReservations(sorted)
	if sorted == nil {
		sorted = []MigReservation{}
	}
	b, err := json.Marshal(sorted)
	return string(b), err
}

// SortMigReservations sorts records in (containerIndex, deviceIndex) order, the order
// EncodeMigReservations writes and DecodeMigReservations therefore returns.
func SortMigReservations(recs []MigReservation) {
	slices.SortFunc(recs, func(a, b MigReservation) int {
		return cmp.Or(cmp.Compare(a.ContainerIndex, b.ContainerIndex), cmp.Compare(a.DeviceIndex, b.DeviceIndex))
	})
}

// ValidateMigReservations checks one pod's reservations on their own: complete records,
// all-or-none runtime identity, unique (containerIndex, deviceIndex), and no two records
// overlapping on one GPU (a pod's instances coexist, init containers' included).
func ValidateMigReservations(recs []MigReservation) field.ErrorList {
	var errs field.ErrorList
	seen := make(map[ReservationKey]int, len(recs))
	for i := range recs {
		r, p := &recs[i], reservationsPath.Index(i)
		errs = append(errs, nonNegative(p.Child("containerIndex"), r.ContainerIndex)...)
		errs = append(errs, nonNegative(p.Child("deviceIndex"), r.DeviceIndex)...)
		if r.GPUUUID == "" {
			errs = append(errs, field.Required(p.Child("gpuUUID"), "the UUID of the reserved GPU"))
		}
		if _, err := ParseProfileName(r.Profile); err != nil {
			errs = append(errs, field.Invalid(p.Child("profile"), r.Profile, err.Error()))
		}
		if r.Placement.Start < 0 {
			errs = append(errs, field.Invalid(p.Child("placement", "start"), r.Placement.Start, "must not be negative"))
		}
		if r.Placement.Size <= 0 {
			errs = append(errs, field.Invalid(p.Child("placement", "size"), r.Placement.Size, "must be positive"))
		}
		errs = append(errs, validateRuntimeIdentity(p, r)...)
		if j, dup := seen[r.Key()]; dup {
			errs = append(errs, field.Duplicate(p, fmt.Sprintf("containerIndex %d, deviceIndex %d (also record %d)", r.ContainerIndex, r.DeviceIndex, j)))
		} else {
			seen[r.Key()] = i
		}
	}
	for _, o := range Overlaps(recs) {
		errs = append(errs, field.Invalid(reservationsPath.Index(o.Second).Child("placement"), recs[o.Second].Placement.String(),
			fmt.Sprintf("overlaps record %d's %s on GPU %s", o.First, recs[o.First].Placement, recs[o.First].GPUUUID)))
	}
	return errs
}

func validateRuntimeIdentity(p *field.Path, r *MigReservation) field.ErrorList {
	set := 0
	for _, present := range []bool{r.MigUUID != "", r.GPUInstanceID != nil, r.ComputeInstanceID != nil} {
		if present {
			set++
		}
	}
	var errs field.ErrorList
	if set != 0 && set != 3 {
		errs = append(errs, field.Invalid(p, fmt.Sprintf("migUUID=%q gpuInstanceID=%s computeInstanceID=%s", r.MigUUID, optUint(r.GPUInstanceID), optUint(r.ComputeInstanceID)),
			"runtime identity must be complete (migUUID, gpuInstanceID, computeInstanceID) or absent"))
	}
	if r.MigUUID != "" && !strings.HasPrefix(r.MigUUID, "MIG-") {
		errs = append(errs, field.Invalid(p.Child("migUUID"), r.MigUUID, "must start with \"MIG-\""))
	}
	return errs
}

func optUint(v *uint32) string {
	if v == nil {
		return "<absent>"
	}
	return fmt.Sprint(*v)
}

// Overlap names two records, by index, whose placements share a slot of one GPU.
type Overlap struct{ First, Second int }

// Overlaps lists every pair of records on the same GPU whose half-open placements intersect.
func Overlaps(recs []MigReservation) []Overlap {
	var out []Overlap
	for i := range recs {
		for j := i + 1; j < len(recs); j++ {
			if recs[i].GPUUUID == recs[j].GPUUUID && recs[i].Placement.Overlaps(recs[j].Placement) {
				out = append(out, Overlap{First: i, Second: j})
			}
		}
	}
	return out
}

// ValidateAgainstInventory checks reservations against the node inventory they were made
// on: the GPU exists in MIG mode, publishes the profile, and the placement is one of that
// profile's legal placements inside the GPU's slots.
func ValidateAgainstInventory(recs []MigReservation, gpus []GPU) field.ErrorList {
	byID := make(map[string]*GPU, len(gpus))
	for i := range gpus {
		byID[gpus[i].ID] = &gpus[i]
	}
	var errs field.ErrorList
	for i := range recs {
		r, p := &recs[i], reservationsPath.Index(i)
		g, ok := byID[r.GPUUUID]
		switch {
		case !ok:
			errs = append(errs, field.NotFound(p.Child("gpuUUID"), r.GPUUUID))
			continue
		case g.Mode != ModeMIG:
			errs = append(errs, field.Invalid(p.Child("gpuUUID"), r.GPUUUID, fmt.Sprintf("GPU is in mode %q, not %q", g.Mode, ModeMIG)))
			continue
		}
		prof, ok := g.Profile(r.Profile)
		if !ok {
			errs = append(errs, field.Invalid(p.Child("profile"), r.Profile, fmt.Sprintf("GPU %s does not offer this profile", g.ID)))
			continue
		}
		if !r.Placement.Within(g.SlotCount()) {
			errs = append(errs, field.Invalid(p.Child("placement"), r.Placement.String(), fmt.Sprintf("must lie inside the GPU's %d memory slots", g.SlotCount())))
		} else if !prof.HasPlacement(r.Placement) {
			errs = append(errs, field.Invalid(p.Child("placement"), r.Placement.String(), fmt.Sprintf("not a legal placement of %s (legal: %v)", prof.Name, prof.Placements)))
		}
	}
	return errs
}

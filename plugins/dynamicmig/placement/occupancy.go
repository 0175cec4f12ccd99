package placement

import "github.com/dynamig/dynamig/api"

// GPUsOf is a node's inventory as GPUs with nothing reserved on them yet, save the
// instances the device plugin reports that no reservation explains, which hold their
// placements all the same.
func GPUsOf(inv []api.GPU) []GPU {
	gpus := make([]GPU, len(inv))
	for i := range inv {
		gpus[i].Info = inv[i]
		for _, in := range inv[i].Unexplained {
			gpus[i].MIG = append(gpus[i].MIG, Instance{Profile: in.Profile, Placement: in.Placement})
		}
	}
	return gpus
}

// gpuIndex is the index of the GPU with the UUID, or -1. A node has a handful of GPUs: a
// scan is cheaper than a map.
func gpuIndex(gpus []GPU, uuid string) int {
	for i := range gpus {
		if gpus[i].Info.ID == uuid {
			return i
		}
	}
	return -1
}

// AddMIGReservations adds a pod's recorded MIG reservations to the GPUs they name;
// reservations of GPUs the node does not list are ignored.
func AddMIGReservations(gpus []GPU, recs []api.MigReservation) {
	for _, r := range recs {
		if i := gpuIndex(gpus, r.GPUUUID); i >= 0 {
			gpus[i].MIG = append(gpus[i].MIG, Instance{Profile: r.Profile, Placement: r.Placement})
		}
	}
}

// AddHAMiCoreShares adds a pod's hami-core devices (per container) to the GPUs they name.
func AddHAMiCoreShares(gpus []GPU, containers [][]api.HAMiCoreDevice) {
	for _, devs := range containers {
		for _, d := range devs {
			if i := gpuIndex(gpus, d.UUID); i >= 0 {
				gpus[i].Shares = append(gpus[i].Shares, Share{MemoryMiB: d.MemoryMiB, Cores: d.Cores})
			}
		}
	}
}

// Held is what a bound pod's reservation annotations hold: its MIG reservations
// (hami.io/vgpu-mig-allocations) and its hami-core devices (hami.io/vgpu-devices-allocated).
type Held struct {
	MIG    []api.MigReservation
	Shares [][]api.HAMiCoreDevice
}

// DecodeHeld reads what a pod's annotations hold, its MIG reservations with decodeMIG.
// found says whether the pod carries either; a reservation that does not decode is an error,
// since it could hide an occupied placement.
func DecodeHeld(annotations map[string]string, decodeMIG func(string) ([]api.MigReservation, error)) (h Held, found bool, err error) {
	raw, hasMIG := annotations[api.MigReservationsAnnotation]
	coreRaw, hasCore := annotations[api.DevicesAllocatedAnnotation]
	if hasMIG {
		if h.MIG, err = decodeMIG(raw); err != nil {
			return Held{}, true, err
		}
	}
	if hasCore {
		if h.Shares, err = api.DecodeHAMiCoreDevices(api.DevicesAllocatedAnnotation, coreRaw); err != nil {
			return Held{}, true, err
		}
	}
	return h, hasMIG || hasCore, nil
}

// Add adds what h holds to the GPUs it names.
func (h Held) Add(gpus []GPU) {
	AddMIGReservations(gpus, h.MIG)
	AddHAMiCoreShares(gpus, h.Shares)
}

// AddAnnotated adds what a bound pod's reservation annotations hold to the GPUs (DecodeHeld);
// on an error it adds nothing.
func AddAnnotated(gpus []GPU, annotations map[string]string, decodeMIG func(string) ([]api.MigReservation, error)) (found bool, err error) {
	h, found, err := DecodeHeld(annotations, decodeMIG)
	if err == nil {
		h.Add(gpus)
	}
	return found, err
}

// AddAssignments adds a fit's assignments, not yet recorded on the pod, to the GPUs.
func AddAssignments(gpus []GPU, as []Assignment) {
	for _, a := range as {
		if a.GPU >= len(gpus) {
			continue
		}
		if a.Mode == api.ModeMIG {
			gpus[a.GPU].MIG = append(gpus[a.GPU].MIG, Instance{Profile: a.Profile, Placement: a.Placement})
		} else {
			gpus[a.GPU].Shares = append(gpus[a.GPU].Shares, Share{MemoryMiB: a.MemoryMiB, Cores: a.Cores})
		}
	}
}

// MigReservations are the records the scheduler writes for a MIG fit (the runtime
// identity is the device plugin's to add).
func (r *Result) MigReservations() []api.MigReservation {
	recs := make([]api.MigReservation, len(r.Assignments))
	for i, a := range r.Assignments {
		recs[i] = api.MigReservation{ContainerIndex: a.ContainerIndex, DeviceIndex: a.DeviceIndex, GPUUUID: a.GPUUUID, Profile: a.Profile, Placement: a.Placement}
	}
	return recs
}

// Grant is the GPU memory and cores a pod is granted, summed over its devices: a MIG
// device's profile's (its memory, and its SMs as a percentage of the full GPU's), a hami-core
// share's own. Namespace GPU quotas count it.
type Grant struct {
	MemoryMiB, Cores int64
}

// Add adds o to g.
func (g *Grant) Add(o Grant) {
	g.MemoryMiB += o.MemoryMiB
	g.Cores += o.Cores
}

// Grant is what the fit grants.
func (r *Result) Grant() Grant {
	var g Grant
	for _, a := range r.Assignments {
		g.Add(Grant{MemoryMiB: int64(a.MemoryMiB), Cores: int64(a.Cores)})
	}
	return g
}

// Grant is what h grants on the node's GPUs: a MIG reservation's profile is the one its GPU
// publishes; a reservation of a GPU or profile the inventory does not list grants nothing.
func (h Held) Grant(inv []api.GPU) Grant {
	var g Grant
	for _, r := range h.MIG {
		for i := range inv {
			if inv[i].ID != r.GPUUUID {
				continue
			}
			for _, p := range inv[i].MigProfiles {
				if p.Name == r.Profile {
					g.Add(Grant{MemoryMiB: int64(p.MemoryMB), Cores: int64(p.Core)})
					break
				}
			}
			break
		}
	}
	for _, devs := range h.Shares {
		for _, d := range devs {
			g.Add(Grant{MemoryMiB: int64(d.MemoryMiB), Cores: int64(d.Cores)})
		}
	}
	return g
}

package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/nvml"
)

// The simulated GPUs' state as Options.StateFile keeps it: what a real GPU keeps across a
// restart of the process that uses it (MIG mode, GPU and compute instances, the processes
// on them), so that a device plugin started again in a new process — a DaemonSet's pod
// deleted and made again — finds the instances the old one made. The MIG counter is kept
// too, so a MIG UUID is never handed out twice.
type savedState struct {
	MigCounter uint64     `json:"migCounter"`
	GPUs       []savedGPU `json:"gpus"`
}

type savedGPU struct {
	UUID       string    `json:"uuid"`
	MigCurrent bool      `json:"migCurrent"`
	MigPending bool      `json:"migPending"`
	LastGIID   int       `json:"lastGIID"`
	GIs        []savedGI `json:"gpuInstances"`
}

type savedGI struct {
	ID        int           `json:"id"`
	ProfileID int           `json:"profileID"`
	Placement api.Placement `json:"placement"`
	CIs       []savedCI     `json:"computeInstances"`
}

type savedCI struct {
	ID        int    `json:"id"`
	ProfileID int    `json:"profileID"`
	MigUUID   string `json:"migUUID"`
	Processes []int  `json:"processes"`
}

// persist writes the state to Options.StateFile, when set, replacing the file at once (a
// crash leaves the old state or the new, never half of one); callers hold s.mu and call it
// after every change of what a GPU keeps.
func (s *Sim) persist() error {
	if s.opts.StateFile == "" {
		return nil
	}
	st := savedState{MigCounter: s.migCounter}
	for _, g := range s.gpus {
		sg := savedGPU{UUID: g.uuid, MigCurrent: g.migCurrent, MigPending: g.migPending, LastGIID: g.lastGIID, GIs: []savedGI{}}
		for _, gi := range g.gis {
			sgi := savedGI{ID: gi.id, ProfileID: gi.profile.ID, Placement: gi.placement, CIs: []savedCI{}}
			for _, ci := range gi.cis {
				sci := savedCI{ID: ci.id, ProfileID: ci.profileID, MigUUID: ci.migUUID, Processes: []int{}}
				for pid := range ci.procs {
					sci.Processes = append(sci.Processes, pid)
				}
				slices.Sort(sci.Processes)
				sgi.CIs = append(sgi.CIs, sci)
			}
			slices.SortFunc(sgi.CIs, func(a, b savedCI) int { return a.ID - b.ID })
			sg.GIs = append(sg.GIs, sgi)
		}
		slices.SortFunc(sg.GIs, func(a, b savedGI) int { return a.ID - b.ID })
		st.GPUs = append(st.GPUs, sg)
	}
	raw, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.opts.StateFile), "."+filepath.Base(s.opts.StateFile)+"-")
	if err != nil {
		return fmt.Errorf("sim: saving the GPUs' state: %w", err)
	}
	_, werr := tmp.Write(raw)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("sim: saving the GPUs' state: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.opts.StateFile); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("sim: saving the GPUs' state: %w", err)
	}
	return nil
}

// persisted is persist at the end of NVML call op that changed what a GPU keeps: the change
// stands, and a state that could not be saved is reported as NVML's unknown error.
func (s *Sim) persisted(op string) error {
	if err := s.persist(); err != nil {
		return nvml.Errorf(nvml.ErrorUnknown, op, "%v", err)
	}
	return nil
}

// restore loads Options.StateFile into the GPUs New built, when the file exists: every
// GPU of the file must be one of them, by UUID, and every instance legal on its model, or
// New fails saying which.
func (s *Sim) restore() error {
	raw, err := os.ReadFile(s.opts.StateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st savedState
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("%s: %w", s.opts.StateFile, err)
	}
	migUUIDs := map[string]bool{}
	byUUID := map[string]*gpuState{}
	for _, g := range s.gpus {
		byUUID[g.uuid] = g
	}
	for _, sg := range st.GPUs {
		g, ok := byUUID[sg.UUID]
		delete(byUUID, sg.UUID) // a GPU once
		if !ok {
			return fmt.Errorf("%s: GPU %s is not one of the simulated GPUs, or is there twice (another node's state, or other --sim-gpus?)", s.opts.StateFile, sg.UUID)
		}
		g.migCurrent, g.migPending, g.lastGIID = sg.MigCurrent, sg.MigPending, sg.LastGIID
		for _, sgi := range sg.GIs {
			op := fmt.Sprintf("restoring GPU instance %d of %s", sgi.ID, g.uuid)
			p, err := g.profile(op, sgi.ProfileID)
			if err != nil {
				return fmt.Errorf("%s: %w", s.opts.StateFile, err)
			}
			if sgi.Placement.Size != p.Placements.Size || !slices.Contains(p.Placements.Starts, sgi.Placement.Start) {
				return fmt.Errorf("%s: %s: %s is not a legal placement of %s", s.opts.StateFile, op, sgi.Placement, p.Name)
			}
			if err := g.checkFits(op, p, sgi.Placement); err != nil {
				return fmt.Errorf("%s: %w", s.opts.StateFile, err)
			}
			if _, dup := g.gis[sgi.ID]; dup || sgi.ID < 1 || sgi.ID > g.giIDPool {
				return fmt.Errorf("%s: %s: id out of range or repeated", s.opts.StateFile, op)
			}
			gi := &giState{gpu: g, id: sgi.ID, profile: p, name: p.ParsedName(), placement: sgi.Placement, cis: map[int]*ciState{}}
			// As CreateComputeInstance makes them: at most one, the full-GI one.
			if len(sgi.CIs) > 1 {
				return fmt.Errorf("%s: %s: %d compute instances (a GPU instance holds one)", s.opts.StateFile, op, len(sgi.CIs))
			}
			for _, sci := range sgi.CIs {
				want, ok := gi.ciProfile()
				if !ok || sci.ID != 0 || sci.ProfileID != want || !strings.HasPrefix(sci.MigUUID, "MIG-") || migUUIDs[sci.MigUUID] {
					return fmt.Errorf("%s: %s: compute instance %d (profile %d, %q) is not the GPU instance's full compute instance, or its MIG UUID is taken", s.opts.StateFile, op, sci.ID, sci.ProfileID, sci.MigUUID)
				}
				migUUIDs[sci.MigUUID] = true
				ci := &ciState{gi: gi, id: sci.ID, profileID: sci.ProfileID, migUUID: sci.MigUUID, procs: map[int]bool{}}
				for _, pid := range sci.Processes {
					if pid <= 0 || ci.procs[pid] {
						return fmt.Errorf("%s: %s: process %d is not a positive PID, or repeated", s.opts.StateFile, op, pid)
					}
					ci.procs[pid] = true
				}
				gi.cis[ci.id] = ci
			}
			g.gis[gi.id] = gi
		}
	}
	s.migCounter = st.MigCounter
	return nil
}

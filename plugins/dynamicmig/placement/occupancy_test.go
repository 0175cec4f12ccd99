package placement

import (
	"testing"

	"github.com/dynamig/dynamig/api"
)

// TestOccupancyFromRecords: recorded reservations and shares land on the GPU they name,
// unknown GPUs are ignored, and a fit's records round-trip through MigReservations.
func TestOccupancyFromRecords(t *testing.T) {
	gpus := inventoryOf(t, "", "", "A100-40GB", "A100-40GB")
	second := gpus[1].Info.ID
	AddMIGReservations(gpus, []api.MigReservation{
		{GPUUUID: second, Profile: "3g.20gb", Placement: api.Placement{Start: 4, Size: 4}},
		{GPUUUID: "GPU-not-here", Profile: "1g.5gb", Placement: api.Placement{Start: 0, Size: 1}},
	})
	if len(gpus[0].MIG) != 0 || len(gpus[1].MIG) != 1 || gpus[1].MIG[0] != (Instance{Profile: "3g.20gb", Placement: api.Placement{Start: 4, Size: 4}}) {
		t.Fatalf("occupancy %+v / %+v", gpus[0].MIG, gpus[1].MIG)
	}
	AddHAMiCoreShares(gpus, [][]api.HAMiCoreDevice{nil, {{UUID: second, MemoryMiB: 1000, Cores: 10}, {UUID: "GPU-not-here", MemoryMiB: 1}}})
	if len(gpus[1].Shares) != 1 || gpus[1].Shares[0] != (Share{MemoryMiB: 1000, Cores: 10}) || len(gpus[0].Shares) != 0 {
		t.Fatalf("shares %+v / %+v", gpus[0].Shares, gpus[1].Shares)
	}
	res, why := Fit(gpus, &Request{Mode: api.ModeMIG, Containers: []ContainerRequest{{Devices: 1, MemoryMiB: 15000}}}, Options{MIGPolicy: api.PolicyBinpack, FragmentationAware: true})
	if why != nil {
		t.Fatal(why)
	}
	recs := res.MigReservations()
	if len(recs) != 1 || recs[0].GPUUUID != second || recs[0].Profile != "3g.20gb" || recs[0].Placement != (api.Placement{Start: 0, Size: 4}) {
		t.Fatalf("records %+v", recs)
	}
	AddAssignments(gpus, res.Assignments)
	if len(gpus[1].MIG) != 2 {
		t.Errorf("assignment not added: %+v", gpus[1].MIG)
	}
}

// TestUnexplainedInstancesHoldPlacements: an instance the device plugin reports without a
// reservation holds its placement and counts towards the GPU's instance limits (issue 14,
// defect 2).
func TestUnexplainedInstancesHoldPlacements(t *testing.T) {
	inv := inventoryOf(t, "", "", "A100-40GB")[0].Info
	// Someone made a 3g.20gb at [0,4) and a 1g.5gb at [4,5) (not allowlisted shapes count too).
	inv.Unexplained = []api.Instance{{Profile: "3g.20gb", Placement: api.Placement{Start: 0, Size: 4}}, {Profile: "1g.5gb", Placement: api.Placement{Start: 4, Size: 1}}}
	gpus := GPUsOf([]api.GPU{inv})
	half := &Request{Mode: api.ModeMIG, Containers: []ContainerRequest{{Devices: 1, MemoryMiB: 15000}}}
	if _, why := Fit(gpus, half, defaultOpts); why == nil || why.Reason != ReasonPlacementsTaken {
		t.Errorf("3g.20gb beside the unexplained instances: %v, want all placements taken ([0,4) held, [4,8) broken by [4,5))", why)
	}
	small := &Request{Mode: api.ModeMIG, Containers: []ContainerRequest{{Devices: 1, MemoryMiB: 4000}}}
	res := mustFit(t, gpus, small, defaultOpts)
	if p := res.Assignments[0].Placement; p.Overlaps(api.Placement{Start: 0, Size: 5}) {
		t.Errorf("1g.5gb at %s overlaps an unexplained instance", p)
	}
}

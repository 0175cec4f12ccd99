package sim

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestStateFile: a second simulator on the same state file — a device plugin's process
// started again — finds the GPUs as the first left them (instances, ids, MIG UUIDs,
// processes, MIG mode), hands out GI ids and MIG UUIDs after the old ones, and the file
// follows every change; a file of other GPUs, or not JSON, is refused naming the file.
func TestStateFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "gpus.json")
	specs := []GPUSpec{{Model: "A30-24GB"}, {Model: "A100-40GB", MigDisabled: true}}
	s, err := New(Options{Seed: "n1", StateFile: file}, specs...)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Init()
	d, _ := s.DeviceByIndex(0)
	create(t, d, "A30-24GB", "2g.12gb", 2)
	a := create(t, d, "A30-24GB", "1g.6gb", 0)
	ci, err := a.CreateComputeInstance()
	if err != nil {
		t.Fatal(err)
	}
	migs, _ := d.MigDevices()
	mu, _ := migs[0].UUID()
	if err := s.AddProcess(mu, 42); err != nil {
		t.Fatal(err)
	}
	d1, _ := s.DeviceByIndex(1)
	if err := d1.SetMigMode(true); err != nil {
		t.Fatal(err)
	}
	before := s.Snapshot()

	again, err := New(Options{Seed: "n1", StateFile: file}, specs...)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.Snapshot(); !reflect.DeepEqual(got, before) {
		t.Fatalf("restored:\n got %+v\nwant %+v", got, before)
	}
	_ = again.Init()
	d, _ = again.DeviceByIndex(0)
	c := create(t, d, "A30-24GB", "1g.6gb", 1)
	if id := giID(t, c); id != 3 {
		t.Errorf("the next GI id after 1 and 2: %d", id)
	}
	if _, err := c.CreateComputeInstance(); err != nil {
		t.Fatal(err)
	}
	migs, _ = d.MigDevices()
	seen := map[string]bool{}
	for _, m := range migs {
		u, _ := m.UUID()
		if seen[u] {
			t.Errorf("MIG UUID %s handed out twice", u)
		}
		seen[u] = true
	}
	// The old handles belong to the old process; the change made by the new one is saved.
	_ = ci
	if err := again.RemoveProcess(mu, 42); err != nil {
		t.Fatal(err)
	}
	third, err := New(Options{Seed: "n1", StateFile: file}, specs...)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := third.Snapshot(), again.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Errorf("after changes in the second process:\n got %+v\nwant %+v", got, want)
	}

	if _, err := New(Options{Seed: "n2", StateFile: file}, specs...); err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "not one of the simulated GPUs") {
		t.Errorf("another node's GPUs: %v", err)
	}
	if err := os.WriteFile(file, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Seed: "n1", StateFile: file}, specs...); err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("a broken file: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Dir(file))
	if len(entries) != 1 {
		t.Errorf("left in the state file's directory: %v", entries)
	}
}

// FuzzRestore: any state file is loaded or refused, never half: a file that loads gives a
// simulator whose own saved state loads again to the same GPUs (no GI beyond the rules of
// its model was let in, or its save would differ from what a second load accepts).
func FuzzRestore(f *testing.F) {
	f.Add([]byte(`{"migCounter":1,"gpus":[{"uuid":"GPU-x","migCurrent":true,"migPending":true,"lastGIID":1,"gpuInstances":[{"id":1,"profileID":14,"placement":{"start":0,"size":1},"computeInstances":[{"id":0,"profileID":0,"migUUID":"MIG-a","processes":[7]}]}]}]}`))
	f.Add([]byte(`{"gpus":[]}`))
	f.Add([]byte(`{`))
	dir := f.TempDir()
	specs := []GPUSpec{{Model: "A30-24GB", UUID: "GPU-x"}, {Model: "A100-40GB", UUID: "GPU-y"}}
	f.Fuzz(func(t *testing.T, raw []byte) {
		file := filepath.Join(dir, "state.json")
		if err := os.WriteFile(file, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := New(Options{StateFile: file}, specs...)
		if err != nil {
			return
		}
		before := s.Snapshot()
		s.mu.Lock()
		err = s.persist()
		s.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		again, err := New(Options{StateFile: file}, specs...)
		if err != nil {
			t.Fatalf("a state this simulator saved is refused: %v", err)
		}
		if got := again.Snapshot(); !reflect.DeepEqual(got, before) {
			t.Fatalf("saved and loaded again:\n got %+v\nwant %+v", got, before)
		}
	})
}

package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dynamig/dynamig/api"
)

func entry(uid string, c, d int, state State) Entry {
	e := Entry{Key: Key{PodUID: uid, ContainerIndex: c, DeviceIndex: d}, PodNamespace: "ns", PodName: "p",
		GPUUUID: "GPU-1", Profile: "2g.10gb", Placement: api.Placement{Start: 2 * d, Size: 2}, State: state}
	if state == Created {
		e.GPUInstanceID, e.ComputeInstanceID, e.MigUUID = 3, 0, "MIG-x"
	}
	return e
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dynamig.checkpoint")
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put(entry("u1", 0, 0, Intent)); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(entry("u1", 0, 0, Created)); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(entry("u1", 0, 1, Intent)); err != nil {
		t.Fatal(err)
	}
	again, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	got := again.Entries()
	if len(got) != 2 || got[0].State != Created || got[0].MigUUID != "MIG-x" || got[1].State != Intent {
		t.Fatalf("reloaded: %+v", got)
	}
	if err := again.Remove(got[0].Key); err != nil {
		t.Fatal(err)
	}
	third, _ := Open(path)
	if len(third.Entries()) != 1 {
		t.Errorf("remove not persisted: %+v", third.Entries())
	}
	if matches, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".dynamig-checkpoint-*")); len(matches) != 0 {
		t.Errorf("temp files left: %v", matches)
	}
}

func TestRefusals(t *testing.T) {
	c, _ := Open(filepath.Join(t.TempDir(), "cp"))
	bad := entry("u", 0, 0, Created)
	bad.MigUUID = ""
	if err := c.Put(bad); err == nil {
		t.Error("created without a MIG UUID must be refused")
	}
	for doc, want := range map[string]string{
		`{`:             "not a checkpoint",
		`{"version":2}`: "version is 2",
		`{"version":1,"entries":[{"podUID":"","gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":0,"size":1},"state":"intent"}]}`:                                                                                                        "entries[0]: podUID",
		`{"version":1,"entries":[{"podUID":"u","gpuUUID":"GPU-1","profile":"1g5gb","placement":{"start":0,"size":1},"state":"intent"}]}`:                                                                                                        "entries[0]: profile",
		`{"version":1,"entries":[{"podUID":"u","gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":0,"size":1},"state":"done"}]}`:                                                                                                         `state "done"`,
		`{"version":1,"entries":[{"podUID":"u","gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":0,"size":1},"state":"intent"},{"podUID":"u","gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":1,"size":1},"state":"intent"}]}`: "entries[1]: duplicate",
	} {
		if _, err := Decode([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", doc, err, want)
		}
	}
	// An unreadable file is an error, never an empty checkpoint.
	path := filepath.Join(t.TempDir(), "cp")
	os.WriteFile(path, []byte("garbage"), 0o600)
	if _, err := Open(path); err == nil {
		t.Error("a corrupt checkpoint must not open as empty")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"version":1,"entries":[{"podUID":"u","containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-1","profile":"1g.5gb","placement":{"start":0,"size":1},"state":"created","migUUID":"MIG-1","gpuInstanceID":7}]}`))
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := Decode(data)
		if err != nil {
			return
		}
		for _, e := range entries {
			if err := e.validate(); err != nil {
				t.Fatalf("decoded an invalid entry: %v", err)
			}
		}
	})
}

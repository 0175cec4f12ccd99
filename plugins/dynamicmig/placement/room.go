package placement

import "github.com/dynamig/dynamig/api"

// ProfileRoom is how many more instances of one profile fit on a MIG GPU beside its
// reserved instances, by the allocator's own rules, and where.
type ProfileRoom struct {
	Profile string
	// More is how many more instances fit together (capacity, as Fit counts it).
	More int
	// Free are the profile's placements no instance overlaps.
	Free []api.Placement
	// Limit says which rule (instance count, compute slices, media engines) allows no more,
	// "" when none does.
	Limit string
}

// Room is, per profile the GPU publishes, in its order, the room for more instances beside
// instances. A GPU that is not a MIG GPU has none.
func Room(info *api.GPU, instances []Instance) []ProfileRoom {
	if info.Mode != api.ModeMIG {
		return nil
	}
	g := newMIGGPU(info)
	var u migUsage
	for _, inst := range instances {
		g.add(&u, inst.Profile, inst.Placement)
	}
	out := make([]ProfileRoom, 0, len(g.profiles))
	for i := range g.profiles {
		p := &g.profiles[i]
		r := ProfileRoom{Profile: p.pub.Name, More: g.capacity(&u, i), Free: []api.Placement{}, Limit: g.limit(&u, i)}
		for _, pl := range p.pub.Placements {
			if m := maskOf(pl); m != 0 && pl.End() <= g.slots && m&u.used == 0 {
				r.Free = append(r.Free, pl)
			}
		}
		out = append(out, r)
	}
	return out
}

// Package metricsdoc reads docs/metrics.md's HAMi mapping table for the tests that hold it
// to what dynamig exports: test/metrics against the registries' descriptions, and the
// scheduler's and the device plugin's own tests against a scrape of realistic state.
package metricsdoc

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The files that define the HAMi series dynamig exports, as the table names them.
const (
	SchedulerFile    = "plugins/dynamicmig/collector.go"
	DevicePluginFile = "deviceplugin/metrics/metrics.go"
)

// Zone is the constant label HAMi registers its series under, and dynamig with them.
var Zone = [2]string{"zone", "vGPU"}

// HAMiSeries is one row of the HAMi mapping table.
type HAMiSeries struct {
	Name string
	// Labels are HAMi's labels of the series as the row lists them, zone aside.
	Labels []string
	// DefinedIn is the file that defines dynamig's series of the same name and labels, ""
	// where dynamig does not export it.
	DefinedIn string
}

// hamiHeader is the mapping table's header row.
var hamiHeader = []string{"HAMi series", "HAMi source", "labels", "dynamig"}

var (
	codeSpan = regexp.MustCompile("`([^`]*)`")
	goFile   = regexp.MustCompile("`([a-z/]+\\.go)`")
)

// Path is docs/metrics.md, found from this file so that any package's test reads it.
func Path() string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..", "docs", "metrics.md")
}

// HAMiTable reads the HAMi mapping table. A row is exported when its dynamig cell begins
// with "**Exported**"; that cell then names the file that defines the series.
func HAMiTable(tb testing.TB) []HAMiSeries {
	tb.Helper()
	raw, err := os.ReadFile(Path())
	if err != nil {
		tb.Fatal(err)
	}
	var out []HAMiSeries
	inTable := false
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "|") {
			inTable = false
			continue
		}
		c := Cells(line)
		if slices.Equal(c, hamiHeader) {
			inTable = true
			continue
		}
		if !inTable || len(c) != len(hamiHeader) || strings.HasPrefix(c[0], "---") {
			continue
		}
		name := codeSpan.FindStringSubmatch(c[0])
		if name == nil {
			tb.Fatalf("%s: a HAMi row without a series name in backticks: %q", Path(), line)
		}
		row := HAMiSeries{Name: name[1]}
		for _, m := range codeSpan.FindAllStringSubmatch(c[2], -1) {
			row.Labels = append(row.Labels, m[1])
		}
		if strings.HasPrefix(c[3], "**Exported**") {
			file := goFile.FindStringSubmatch(c[3])
			if file == nil {
				tb.Fatalf("%s: the exported row of %s names no defining file", Path(), row.Name)
			}
			row.DefinedIn = file[1]
		}
		out = append(out, row)
	}
	if len(out) < 20 {
		tb.Fatalf("%s: only %d rows in the HAMi mapping table", Path(), len(out))
	}
	return out
}

// Cells splits a Markdown table row; a | inside backticks is text.
func Cells(line string) []string {
	var out []string
	var cur strings.Builder
	code := false
	for _, r := range strings.TrimSpace(line) {
		switch {
		case r == '`':
			code = !code
			cur.WriteRune(r)
		case r == '|' && !code:
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	out = append(out, strings.TrimSpace(cur.String()))
	if len(out) >= 2 {
		out = out[1 : len(out)-1] // the empty text outside the outer bars
	}
	return out
}

// CheckScraped gathers g and fails the test for every row the table says file defines that
// the scrape lacks: no sample of that name whose labels are exactly the row's and
// zone="vGPU". It returns how many rows it checked.
func CheckScraped(t *testing.T, g prometheus.Gatherer, file string) int {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]int{}
	for i, f := range families {
		byName[f.GetName()] = i
	}
	checked := 0
	for _, row := range HAMiTable(t) {
		if row.DefinedIn != file {
			continue
		}
		checked++
		want := append(slices.Clone(row.Labels), Zone[0])
		slices.Sort(want)
		i, ok := byName[row.Name]
		if !ok || len(families[i].GetMetric()) == 0 {
			t.Errorf("%s lists %s as exported by %s, and the scrape has no sample of it", Path(), row.Name, file)
			continue
		}
		var seen [][]string
		found := false
		for _, m := range families[i].GetMetric() {
			var got []string
			zone := ""
			for _, l := range m.GetLabel() {
				got = append(got, l.GetName())
				if l.GetName() == Zone[0] {
					zone = l.GetValue()
				}
			}
			slices.Sort(got)
			if slices.Equal(got, want) && zone == Zone[1] {
				found = true
				break
			}
			seen = append(seen, got)
		}
		if !found {
			t.Errorf("%s lists %s with labels %v and zone=%q; the scrape's samples have %v", Path(), row.Name, row.Labels, Zone[1], seen)
		}
	}
	return checked
}

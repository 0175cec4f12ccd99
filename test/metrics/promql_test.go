package metrics

import (
	"fmt"
	"strings"
	"unicode"
)

// selector is one vector selector of a PromQL expression: a metric name and the label names
// its matchers use.
type selector struct {
	name   string
	labels []string
}

// PromQL words that are not metric names (functions are told by the parenthesis after them).
var (
	// Each takes a parenthesised list of label names, optional after group_left/right.
	labelListKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	aggregators       = map[string]bool{"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
		"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true}
	keywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true, "inf": true, "nan": true}
)

// selectors lists the vector selectors of a PromQL expression, in which Grafana's variables
// ($node, ${datasource}, $__rate_interval) may stand in strings and ranges. It is a
// tokenizer, not a parser: it tells metric names from functions, aggregators, keywords,
// label lists, strings, numbers and durations, which is all the dashboard test needs.
// (Prometheus' own parser is in module github.com/prometheus/prometheus, which is not among
// dynamig's modules and would bring its large dependency tree into go.mod for one test.)
func selectors(expr string) ([]selector, error) {
	s := []rune(expr)
	var out []selector
	i := 0
	skipSpace := func() {
		for i < len(s) && unicode.IsSpace(s[i]) {
			i++
		}
	}
	isIdentStart := func(r rune) bool { return r == '_' || r == ':' || unicode.IsLetter(r) }
	isIdent := func(r rune) bool { return isIdentStart(r) || unicode.IsDigit(r) }
	ident := func() string {
		start := i
		for i < len(s) && isIdent(s[i]) {
			i++
		}
		return string(s[start:i])
	}
	skipString := func() error {
		q := s[i]
		for i++; i < len(s); i++ {
			switch {
			case s[i] == '\\' && q != '`':
				i++
			case s[i] == q:
				i++
				return nil
			}
		}
		return fmt.Errorf("unterminated string in %q", expr)
	}
	skipTo := func(close rune) error {
		for ; i < len(s); i++ {
			if s[i] == close {
				i++
				return nil
			}
		}
		return fmt.Errorf("no %q in %q", close, expr)
	}
	for i < len(s) {
		r := s[i]
		switch {
		case unicode.IsSpace(r):
			i++
		case r == '"' || r == '\'' || r == '`':
			if err := skipString(); err != nil {
				return nil, err
			}
		case r == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case r == '[': // a range or subquery: durations, variables
			if err := skipTo(']'); err != nil {
				return nil, err
			}
		case r == '$': // a Grafana variable: $name, ${name}, ${name:format}
			i++
			if i < len(s) && s[i] == '{' {
				if err := skipTo('}'); err != nil {
					return nil, err
				}
			} else {
				ident()
			}
		case r == '{':
			return nil, fmt.Errorf("a selector without a metric name in %q", expr)
		case unicode.IsDigit(r) || r == '.' && i+1 < len(s) && unicode.IsDigit(s[i+1]): // numbers, durations
			for i < len(s) && (isIdent(s[i]) || s[i] == '.') {
				i++
			}
		case isIdentStart(r):
			word := ident()
			skipSpace()
			next := rune(0)
			if i < len(s) {
				next = s[i]
			}
			switch {
			case labelListKeywords[word]:
				if next == '(' {
					if err := skipTo(')'); err != nil {
						return nil, err
					}
				}
			case aggregators[word] || keywords[strings.ToLower(word)] || next == '(':
			default:
				sel := selector{name: word}
				if next == '{' {
					i++
					for {
						skipSpace()
						if i >= len(s) {
							return nil, fmt.Errorf("unterminated matchers of %s in %q", word, expr)
						}
						if s[i] == '}' {
							i++
							break
						}
						if s[i] == ',' {
							i++
							continue
						}
						label := ident()
						if label == "" {
							return nil, fmt.Errorf("bad matcher of %s at %q in %q", word, string(s[i:]), expr)
						}
						sel.labels = append(sel.labels, label)
						skipSpace()
						for i < len(s) && strings.ContainsRune("=!~", s[i]) {
							i++
						}
						skipSpace()
						if i >= len(s) || !strings.ContainsRune("\"'`", s[i]) {
							return nil, fmt.Errorf("matcher %s of %s without a string in %q", label, word, expr)
						}
						if err := skipString(); err != nil {
							return nil, err
						}
					}
				}
				out = append(out, sel)
			}
		default: // operators, parentheses, commas, @
			i++
		}
	}
	return out, nil
}

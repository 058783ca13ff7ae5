package chattemplate

import (
	"fmt"
	"strings"
	"time"
)

// globals are the functions a template can call by name: Jinja's range, namespace and
// dict, and the two transformers adds (raise_exception, strftime_now).
var globals map[string]any

func init() {
	globals = map[string]any{
		"range":           &builtin{name: "range", fn: builtinRange},
		"namespace":       &builtin{name: "namespace", fn: builtinNamespace},
		"dict":            &builtin{name: "dict", fn: builtinDict},
		"raise_exception": &builtin{name: "raise_exception", fn: builtinRaise},
		"strftime_now":    &builtin{name: "strftime_now", fn: builtinStrftimeNow},
	}
}

func builtinRange(ev *evaluator, line int, args []any, _ []kwval) (any, error) {
	var b [3]int64
	for i, a := range args {
		_, n, isInt, ok := number(a)
		if !ok || !isInt || i > 2 {
			return nil, ev.errf(line, "range() takes 1 to 3 integer arguments")
		}
		b[i] = n
	}
	start, stop, step := int64(0), b[0], int64(1)
	switch len(args) {
	case 0:
		return nil, ev.errf(line, "range expected at least 1 argument, got 0")
	case 2:
		start, stop = b[0], b[1]
	case 3:
		start, stop, step = b[0], b[1], b[2]
	}
	if step == 0 {
		return nil, ev.errf(line, "range() arg 3 must not be zero")
	}
	// Counted in uint64: stop-start of two int64s cannot overflow there.
	n := uint64(0)
	switch {
	case step > 0 && stop > start:
		n = (uint64(stop)-uint64(start)-1)/uint64(step) + 1
	case step < 0 && stop < start:
		n = (uint64(start)-uint64(stop)-1)/(uint64(-(step+1))+1) + 1
	}
	// A range is materialized; it may not be longer than the steps left to visit it.
	if n > uint64(ev.maxSteps-ev.steps) {
		return nil, &Error{Line: line, Msg: fmt.Sprintf("range of %d items exceeds the step budget", n), Err: ErrLimit}
	}
	out := make([]any, n)
	for i := range out {
		out[i] = start + int64(i)*step
	}
	return out, nil
}

func builtinNamespace(ev *evaluator, line int, args []any, kw []kwval) (any, error) {
	ns := &namespace{d: NewDict()}
	for _, a := range args {
		d, ok := a.(*Dict)
		if !ok {
			return nil, ev.errf(line, "namespace() positional arguments must be mappings")
		}
		for i, k := range d.keys {
			ns.d.Set(k, d.vals[i])
		}
	}
	for _, k := range kw {
		ns.d.Set(k.name, k.v)
	}
	return ns, nil
}

func builtinDict(ev *evaluator, line int, args []any, kw []kwval) (any, error) {
	d := NewDict()
	for _, a := range args {
		src, ok := a.(*Dict)
		if !ok {
			return nil, ev.errf(line, "dict() positional arguments must be mappings")
		}
		for i, k := range src.keys {
			d.Set(k, src.vals[i])
		}
	}
	for _, k := range kw {
		d.Set(k.name, k.v)
	}
	return d, nil
}

func builtinRaise(ev *evaluator, line int, args []any, _ []kwval) (any, error) {
	msg := ""
	if len(args) > 0 {
		msg = ev.str(args[0])
	}
	return nil, &Error{Line: line, Msg: msg, Err: ErrRaised}
}

func builtinStrftimeNow(ev *evaluator, line int, args []any, _ []kwval) (any, error) {
	if len(args) != 1 {
		return nil, ev.errf(line, "strftime_now() takes one format argument")
	}
	return strftime(ev.now(), ev.str(args[0])), nil
}

// strftime formats t with C strftime directives (the ones chat templates use); an
// unknown directive is kept as written, as glibc does.
func strftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'Y':
			fmt.Fprintf(&b, "%d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			fmt.Fprintf(&b, "%02d", (t.Hour()+11)%12+1)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'p':
			b.WriteString(t.Format("PM"))
		case 'B':
			b.WriteString(t.Month().String())
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'w':
			fmt.Fprintf(&b, "%d", int(t.Weekday()))
		case 'Z':
			b.WriteString(t.Format("MST"))
		case 'z':
			b.WriteString(t.Format("-0700"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

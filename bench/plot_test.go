package bench

import (
	"fmt"
	"html"
	"math"
	"os"
	"strings"
)

// A small SVG bar chart writer for make bench-scale: panels side by side,
// each a titled set of labelled bars with their values written on them. No
// plotting library: the figure is a few rectangles and texts.

// bar is one bar of a panel.
type bar struct {
	label string
	value float64
}

// panel is one chart: a title, the unit of its values and its bars.
type panel struct {
	title, unit string
	bars        []bar
}

const (
	panelWidth   = 300
	panelHeight  = 240
	panelsPerRow = 3
	plotTop      = 40 // room for the title
	plotBottom   = 40 // room for the labels
)

// writeSVG draws panels into path, panelsPerRow to a row.
func writeSVG(path, title string, panels []panel) error {
	rows := (len(panels) + panelsPerRow - 1) / panelsPerRow
	width, height := panelsPerRow*panelWidth, rows*panelHeight+30
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&sb, `<text x="%d" y="20" text-anchor="middle" font-size="14" font-weight="bold">%s</text>`+"\n", width/2, html.EscapeString(title))
	for i, p := range panels {
		x0, y0 := (i%panelsPerRow)*panelWidth, 30+(i/panelsPerRow)*panelHeight
		drawPanel(&sb, p, x0, y0)
	}
	sb.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(sb.String()), 0o644)
}

func drawPanel(sb *strings.Builder, p panel, x0, y0 int) {
	fmt.Fprintf(sb, `<text x="%d" y="%d" text-anchor="middle" font-weight="bold">%s</text>`+"\n", x0+panelWidth/2, y0+18, html.EscapeString(p.title))
	fmt.Fprintf(sb, `<text x="%d" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", x0+panelWidth/2, y0+32, html.EscapeString(p.unit))
	top, bottom := y0+plotTop, y0+panelHeight-plotBottom
	left, right := x0+20, x0+panelWidth-20
	fmt.Fprintf(sb, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", left, bottom, right, bottom)
	peak := 0.0
	for _, b := range p.bars {
		peak = math.Max(peak, b.value)
	}
	if peak == 0 || len(p.bars) == 0 {
		return
	}
	slot := float64(right-left) / float64(len(p.bars))
	for i, b := range p.bars {
		h := float64(bottom-top-14) * b.value / peak
		x := float64(left) + slot*float64(i) + slot*0.15
		w := slot * 0.7
		fmt.Fprintf(sb, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#4a78b5"/>`+"\n", x, float64(bottom)-h, w, h)
		fmt.Fprintf(sb, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x+w/2, float64(bottom)-h-3, html.EscapeString(formatValue(b.value)))
		fmt.Fprintf(sb, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x+w/2, bottom+14, html.EscapeString(b.label))
	}
}

// formatValue writes v with three significant digits at most.
func formatValue(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

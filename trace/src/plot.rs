//! The memory timeline: each live allocation a band, stacked in order of allocation (when one is
//! freed, those above it slide down, as PyTorch's memory_viz draws its "Active Memory
//! Timeline"), drawn as a self-contained HTML page or a static SVG.
//!
//! The layout is computed here once; the page's script only draws it, zooms and shows details.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::analysis::{human_bytes, human_time, Allocation, Timeline};
use crate::error::{Error, Result};

/// What colours the bands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorBy {
    /// The allocation's stream.
    #[default]
    Stream,
    /// The allocation's call site.
    Site,
}

/// How to lay out the plot.
#[derive(Clone, Debug)]
pub struct PlotOptions {
    /// At most this many allocations get a band of their own, the largest; the others are
    /// drawn together as one band on top (memory_viz does the same past its entry limit).
    pub max_bands: usize,
    /// What colours the bands.
    pub color_by: ColorBy,
    /// The page's title.
    pub title: String,
}

impl Default for PlotOptions {
    fn default() -> Self {
        PlotOptions { max_bands: 2000, color_by: ColorBy::Stream, title: "gpumem trace".into() }
    }
}

/// One band: a polygon whose lower edge passes through `(t[i], lo[i])` and upper edge through
/// `(t[i], lo[i] + size)` (or `hi[i]` for the band of the small allocations).
#[derive(Clone, Debug, Serialize)]
pub struct Band {
    /// The allocation's number (`-1` for the band of the small allocations).
    pub id: i64,
    /// Steps.
    pub t: Vec<u64>,
    /// Lower edge, bytes.
    pub lo: Vec<u64>,
    /// Upper edge, bytes, for the band of small allocations only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hi: Option<Vec<u64>>,
    /// Height in bytes (the requested size).
    pub size: u64,
    /// Fill colour.
    pub color: String,
    /// The text shown on hover.
    pub info: String,
}

/// A legend entry.
#[derive(Clone, Debug, Serialize)]
pub struct LegendEntry {
    /// What the colour stands for.
    pub label: String,
    /// The colour.
    pub color: String,
}

/// The laid-out plot.
#[derive(Clone, Debug, Serialize)]
pub struct Layout {
    /// The title.
    pub title: String,
    /// Steps on the time axis.
    pub steps: u64,
    /// The top of the byte axis.
    pub y_max: u64,
    /// The bands, bottom of the stack first at any time.
    pub bands: Vec<Band>,
    /// Allocations drawn with a band of their own.
    pub allocations_drawn: usize,
    /// Allocations in the band of small allocations.
    pub allocations_merged: usize,
    /// Raw bytes held, `(step, bytes)`, when the trace records raw calls.
    pub held: Vec<(u64, u64)>,
    /// Colour legend.
    pub legend: Vec<LegendEntry>,
    /// `time_ns` of the first and last step, when recorded.
    pub time_ns: Option<(u64, u64)>,
}

/// Hues for the colour keys, in order of first appearance (Tableau's ten, then ten more).
const HUES: [u16; 20] =
    [210, 30, 355, 175, 110, 48, 295, 340, 25, 70, 200, 15, 130, 0, 270, 20, 320, 60, 90, 185];

/// A band's colour: the key's hue, its lightness varied by allocation so neighbours of one key
/// stay apart.
fn color(key: usize, id: usize) -> String {
    let hue = HUES[key % HUES.len()];
    let sat = if key < HUES.len() { 62 } else { 40 };
    let light = 42 + (id.wrapping_mul(2_654_435_761) >> 7) % 24;
    format!("hsl({hue},{sat}%,{light}%)")
}

fn info(a: &Allocation) -> String {
    let mut s =
        format!("#{} {} ({} B requested, {} B lent)\n", a.id, human_bytes(a.size), a.size, a.mem_size);
    let _ = write!(s, "address 0x{:x} on device {}, stream {}", a.ptr, a.device_id, a.stream);
    if let Some(th) = a.thread {
        let _ = write!(s, ", thread {th}");
    }
    let _ = write!(
        s,
        "\nevents {} to {}",
        a.start,
        a.end.map_or_else(|| "the end (never freed)".to_owned(), |e| e.to_string())
    );
    if let (Some(t0), end) = (a.start_ns, a.end_ns) {
        let _ = write!(s, "\ntime {}", human_time(t0));
        if let Some(t1) = end {
            let _ = write!(s, " to {} ({} live)", human_time(t1), human_time(t1.saturating_sub(t0)));
        }
    }
    if let Some(site) = &a.site {
        let _ = write!(s, "\nat {site}");
    }
    s
}

/// Lays out `timeline`.
///
/// # Errors
///
/// [`Error::InvalidArgument`] when it has no allocation, or `max_bands` is 0;
/// [`Error::Overflow`] as [`Timeline::stats`].
pub fn layout(timeline: &Timeline, options: &PlotOptions) -> Result<Layout> {
    if timeline.allocations.is_empty() {
        return Err(Error::InvalidArgument("the trace has no pool allocation to plot".into()));
    }
    if options.max_bands == 0 {
        return Err(Error::InvalidArgument("--max-bands must be at least 1".into()));
    }
    // Bytes in use never pass the peak, so the sums below fit once the statistics do.
    let peak = timeline.stats(0)?.peak_in_use;
    let allocs = &timeline.allocations;
    let steps = timeline.steps as u64;
    // Which allocations get a band: the largest `max_bands`.
    let mut own = vec![true; allocs.len()];
    if allocs.len() > options.max_bands {
        let mut order: Vec<usize> = (0..allocs.len()).collect();
        order.sort_by(|&a, &b| allocs[b].size.cmp(&allocs[a].size).then(a.cmp(&b)));
        for &i in &order[options.max_bands..] {
            own[i] = false;
        }
    }
    // The colour keys, in order of first appearance.
    let mut keys: HashMap<String, usize> = HashMap::new();
    let mut legend = Vec::new();
    let key_of = |a: &Allocation| match options.color_by {
        ColorBy::Stream => format!("stream {}", a.stream),
        ColorBy::Site => a.site.clone().unwrap_or_else(|| "(no site)".into()),
    };
    let mut band_of: Vec<Option<usize>> = vec![None; allocs.len()];
    let mut bands: Vec<Band> = Vec::new();
    for (i, a) in allocs.iter().enumerate() {
        if !own[i] {
            continue;
        }
        let label = key_of(a);
        let next = keys.len();
        let key = *keys.entry(label.clone()).or_insert_with(|| {
            legend.push(LegendEntry { label, color: color(next, 0) });
            next
        });
        band_of[i] = Some(bands.len());
        bands.push(Band {
            id: a.id as i64,
            t: Vec::new(),
            lo: Vec::new(),
            hi: None,
            size: a.size,
            color: color(key, a.id),
            info: info(a),
        });
    }
    // What happens at each step: (allocation, starts?).
    let mut at: Vec<Option<(usize, bool)>> = vec![None; timeline.steps];
    for (i, a) in allocs.iter().enumerate() {
        at[a.start] = Some((i, true));
        if let Some(e) = a.end {
            at[e] = Some((i, false));
        }
    }
    let merged = own.iter().filter(|o| !**o).count();
    let mut small = Band {
        id: -1,
        t: Vec::new(),
        lo: Vec::new(),
        hi: Some(Vec::new()),
        size: 0,
        color: "hsl(0,0%,72%)".into(),
        info: format!("{merged} smaller allocations, drawn as one band"),
    };
    let push = |b: &mut Band, t: u64, lo: u64, hi: Option<u64>| {
        if b.t.last() == Some(&t)
            && b.lo.last() == Some(&lo)
            && b.hi.as_ref().and_then(|h| h.last()) == hi.as_ref()
        {
            return;
        }
        b.t.push(t);
        b.lo.push(lo);
        if let (Some(h), Some(v)) = (b.hi.as_mut(), hi) {
            h.push(v);
        }
    };
    let mut stack: Vec<usize> = Vec::new();
    let mut cur: Vec<u64> = vec![0; bands.len()];
    let (mut big, mut small_used) = (0u64, 0u64);
    for (step, what) in at.iter().enumerate() {
        let Some((i, starts)) = *what else { continue };
        let t = step as u64;
        let a = &allocs[i];
        match (band_of[i], starts) {
            (Some(b), true) => {
                cur[b] = big;
                push(&mut bands[b], t, big, None);
                stack.push(b);
                big += a.size;
                // The small band sits on the big ones: it steps up with them.
                push(&mut small, t, big - a.size, Some(big - a.size + small_used));
                push(&mut small, t, big, Some(big + small_used));
            }
            (Some(b), false) => {
                let pos = stack.iter().position(|&x| x == b).expect("a freed band is on the stack");
                push(&mut bands[b], t, cur[b], None);
                stack.remove(pos);
                for &above in &stack[pos..] {
                    push(&mut bands[above], t, cur[above], None);
                    cur[above] -= a.size;
                    push(&mut bands[above], t + 1, cur[above], None);
                }
                push(&mut small, t, big, Some(big + small_used));
                big -= a.size;
                push(&mut small, t + 1, big, Some(big + small_used));
            }
            (None, starts) => {
                push(&mut small, t, big, Some(big + small_used));
                if starts {
                    small_used += a.size;
                } else {
                    small_used -= a.size;
                }
                push(&mut small, t, big, Some(big + small_used));
            }
        }
    }
    for &b in &stack {
        push(&mut bands[b], steps, cur[b], None);
    }
    push(&mut small, steps, big, Some(big + small_used));
    let held: Vec<(u64, u64)> = timeline.held.iter().map(|&(s, h)| (s as u64, h)).collect();
    let y_max = held.iter().map(|h| h.1).max().unwrap_or(0).max(peak).max(1);
    if merged > 0 {
        legend
            .push(LegendEntry { label: format!("{merged} smaller allocations"), color: small.color.clone() });
        bands.push(small);
    }
    let times: Vec<u64> = timeline.step_ns.iter().flatten().copied().collect();
    Ok(Layout {
        title: options.title.clone(),
        steps: steps.max(1),
        y_max,
        allocations_drawn: allocs.len() - merged,
        allocations_merged: merged,
        bands,
        held,
        legend,
        time_ns: times.first().zip(times.last()).map(|(a, b)| (*a, *b)),
    })
}

/// The page's script and style, inlined into every page.
const SCRIPT: &str = include_str!("plot.js");
const STYLE: &str = include_str!("plot.css");

/// `s` safe inside an HTML element or attribute.
fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The self-contained HTML page: the layout as JSON, the script and the style inline, nothing
/// fetched when it is opened.
#[must_use]
pub fn html(layout: &Layout) -> String {
    // `</` would end the script element early; JSON allows `\/` for `/`.
    let data = serde_json::to_string(layout).expect("a layout always serialises").replace("</", "<\\/");
    let title = escape_html(&layout.title);
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n\
         <style>\n{STYLE}</style>\n</head>\n<body>\n<h1>{title}</h1>\n\
         <p id=\"summary\"></p>\n<div id=\"plot\"></div>\n<div id=\"legend\"></div>\n<div id=\"tip\" hidden></div>\n\
         <p class=\"help\">Wheel over the plot to zoom the event axis (one event per allocation or free), drag to pan, double-click to reset. \
         Hover a band for its allocation.</p>\n\
         <script id=\"trace-data\" type=\"application/json\">{data}</script>\n<script>\n{SCRIPT}</script>\n</body>\n</html>\n"
    )
}

/// Plot geometry shared by the SVG writer (the page's script uses the same numbers).
const WIDTH: f64 = 1200.0;
const HEIGHT: f64 = 560.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 40.0;

/// Round tick values: about `n` of them from 0 to `max`.
fn ticks(max: f64, n: usize) -> Vec<f64> {
    if max <= 0.0 {
        return vec![0.0];
    }
    let raw = max / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    (0..).map(|i| i as f64 * step).take_while(|v| *v <= max * 1.000_001).collect()
}

/// Byte ticks at powers of two's round multiples (1 GiB, 512 MiB, ...).
fn byte_ticks(max: u64) -> Vec<u64> {
    let mut step = 1u64;
    while max / step > 8 {
        step *= 2;
    }
    (0..=max / step).map(|i| i * step).collect()
}

/// A static SVG of the layout, each band with its details as a `<title>` tooltip.
#[must_use]
pub fn svg(layout: &Layout) -> String {
    let (pw, ph) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let kx = pw / layout.steps as f64;
    let ky = ph / layout.y_max as f64;
    let x = |t: u64| LEFT + t as f64 * kx;
    let y = |v: u64| TOP + ph - v as f64 * ky;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{h}\" viewBox=\"0 0 {WIDTH} {h}\" \
         font-family=\"sans-serif\" font-size=\"11\">",
        h = HEIGHT + 24.0 + 16.0 * layout.legend.len().min(12) as f64
    );
    let _ = writeln!(s, "<title>{}</title>", escape_html(&layout.title));
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>");
    let _ = writeln!(s, "<g class=\"bands\">");
    for b in &layout.bands {
        let _ = writeln!(
            s,
            "<path class=\"band\" fill=\"{}\" d=\"{}\"><title>{}</title></path>",
            b.color,
            band_path(b, &x, &y),
            escape_html(&b.info)
        );
    }
    let _ = writeln!(s, "</g>");
    if !layout.held.is_empty() {
        let mut d = String::new();
        let mut last = 0u64;
        for (i, &(t, h)) in layout.held.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.2},{:.2} L{:.2},{:.2} ",
                if i == 0 { "M" } else { "L" },
                x(t),
                y(last),
                x(t),
                y(h)
            );
            last = h;
        }
        let _ = write!(d, "L{:.2},{:.2}", x(layout.steps), y(last));
        let _ = writeln!(s, "<path class=\"held\" fill=\"none\" stroke=\"#222\" stroke-width=\"1.2\" stroke-dasharray=\"4 2\" d=\"{d}\"><title>raw bytes held</title></path>");
    }
    // Axes.
    let _ = writeln!(s, "<g stroke=\"#444\" fill=\"#444\">");
    let _ =
        writeln!(s, "<line x1=\"{LEFT}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\"/>", b = TOP + ph, r = LEFT + pw);
    let _ = writeln!(s, "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b}\"/>", b = TOP + ph);
    for t in ticks(layout.steps as f64, 10) {
        let px = LEFT + t * kx;
        let _ = writeln!(s, "<line x1=\"{px:.1}\" y1=\"{b}\" x2=\"{px:.1}\" y2=\"{b2}\"/><text stroke=\"none\" x=\"{px:.1}\" y=\"{ty}\" text-anchor=\"middle\">{t}</text>", b = TOP + ph, b2 = TOP + ph + 4.0, ty = TOP + ph + 16.0);
    }
    for v in byte_ticks(layout.y_max) {
        let py = y(v);
        let _ = writeln!(s, "<line x1=\"{l}\" y1=\"{py:.1}\" x2=\"{LEFT}\" y2=\"{py:.1}\"/><text stroke=\"none\" x=\"{tx}\" y=\"{ty:.1}\" text-anchor=\"end\">{}</text>", human_bytes(v), l = LEFT - 4.0, tx = LEFT - 6.0, ty = py + 4.0);
    }
    let _ = writeln!(s, "<text stroke=\"none\" x=\"{cx}\" y=\"{ty}\" text-anchor=\"middle\">event (one per allocation or free)</text>", cx = LEFT + pw / 2.0, ty = TOP + ph + 32.0);
    let _ = writeln!(s, "</g>");
    for (i, e) in layout.legend.iter().take(12).enumerate() {
        let ly = HEIGHT + 10.0 + 16.0 * i as f64;
        let _ = writeln!(s, "<rect x=\"{LEFT}\" y=\"{ly}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{tx}\" y=\"{ty}\">{}</text>", e.color, escape_html(&e.label), tx = LEFT + 18.0, ty = ly + 10.0);
    }
    let _ = writeln!(s, "</svg>");
    s
}

/// A band's outline: the lower edge forward, the upper edge back.
fn band_path(b: &Band, x: &dyn Fn(u64) -> f64, y: &dyn Fn(u64) -> f64) -> String {
    let mut d = String::with_capacity(b.t.len() * 24);
    let hi = |i: usize| b.hi.as_ref().map_or(b.lo[i] + b.size, |h| h[i]);
    for i in 0..b.t.len() {
        let _ = write!(d, "{}{:.2},{:.2}", if i == 0 { "M" } else { "L" }, x(b.t[i]), y(b.lo[i]));
    }
    for i in (0..b.t.len()).rev() {
        let _ = write!(d, "L{:.2},{:.2}", x(b.t[i]), y(hi(i)));
    }
    d.push('Z');
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Event, Hook};

    fn m(ptr: u64, size: u64) -> Event {
        Event {
            hook: Hook::Malloc,
            size: Some(size),
            mem_size: size,
            mem_ptr: ptr,
            pmem_id: Some(ptr),
            ..Default::default()
        }
    }
    fn f(ptr: u64) -> Event {
        Event { hook: Hook::Free, mem_size: 0, mem_ptr: ptr, pmem_id: Some(ptr), ..Default::default() }
    }

    /// The stack at each step: bands never overlap, and the top is what is in use.
    #[test]
    fn bands_stack_and_slide_down() {
        let t = Timeline::from_events(&[m(1, 100), m(2, 200), m(3, 50), f(1), f(3), m(4, 10)]);
        let l = layout(&t, &PlotOptions::default()).unwrap();
        assert_eq!(l.bands.len(), 4);
        assert_eq!(l.y_max, 350);
        let b2 = &l.bands[1];
        // Allocation 2 starts on top of 1 (offset 100), slides to 0 after 1 is freed at step 3.
        assert_eq!((b2.t.clone(), b2.lo.clone()), (vec![1, 3, 4, 6], vec![100, 100, 0, 0]));
        let b3 = &l.bands[2];
        assert_eq!((b3.t.clone(), b3.lo.clone()), (vec![2, 3, 4], vec![300, 300, 200]));
        let b4 = &l.bands[3];
        assert_eq!((b4.t.clone(), b4.lo.clone()), (vec![5, 6], vec![200, 200]));
    }

    #[test]
    fn the_smallest_allocations_share_one_band() {
        let t = Timeline::from_events(&[m(1, 100), m(2, 5), m(3, 300), f(2), m(4, 7)]);
        let l = layout(&t, &PlotOptions { max_bands: 2, ..Default::default() }).unwrap();
        assert_eq!((l.allocations_drawn, l.allocations_merged), (2, 2));
        let small = l.bands.last().unwrap();
        assert_eq!(small.id, -1);
        let hi = small.hi.as_ref().unwrap();
        // At the end: big bands hold 400, the small band 7 more on top.
        assert_eq!((*small.lo.last().unwrap(), *hi.last().unwrap()), (400, 407));
        assert!(svg(&l).matches("class=\"band\"").count() == 3);
    }

    #[test]
    fn the_page_is_self_contained() {
        let t = Timeline::from_events(&[m(1, 100), Event { site: Some("</script><b>".into()), ..m(2, 10) }]);
        let page = html(&layout(&t, &PlotOptions::default()).unwrap());
        // Nothing to fetch: no URL but the SVG namespace, no external script, style or image.
        let rest = page.replace("http://www.w3.org/2000/svg", "");
        assert!(!rest.contains("http:") && !rest.contains("https:") && !rest.contains("//cdn"));
        assert!(!page.contains(" src=") && !page.contains("<link") && !page.contains("fetch("));
        assert_eq!(page.matches("</script>").count(), 2);
        assert!(layout(&Timeline::default(), &PlotOptions::default()).is_err());
    }
}

/* render.c - attention maps, and line plots (the loss curve of `mha train`),
 * as SVG (written by hand) and PNG (libpng).
 *
 * Letter legend: H heads, L queries (rows), S keys (columns), P panels
 * (H heads, plus the average when H > 1).
 *
 * One layout (layout_make) places everything in pixels; the SVG writer and
 * the rasteriser both draw from it, so the PNG and the SVG show the same
 * figure.  They differ only in how labels are measured: the SVG shows every
 * token as text, the PNG's 5x7 bitmap font only printable ASCII (other
 * tokens become their index, and a footer says so).
 */
#include "render.h"

#include "mha.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MHA_HAVE_PNG
#include <png.h>
#endif

enum {
    MARGIN = 12,      /* around the figure                                  */
    LABEL_MAX = 16,   /* code points of a label shown before truncation      */
    TITLE_MAX = 120,  /* ... of a title                                      */
    LEGEND_BAR = 14,  /* width of the colour bar                             */
    PANEL_GAP = 20    /* between panels                                      */
};

static const char INDEX_NOTE[] = "tokens shown by index (text in the SVG)";

static void set_err(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t n, const char *fmt, ...) {
    if (!err || !n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

/* ---- colour map ------------------------------------------------------------ */

/* viridis (matplotlib, Smith & van der Walt 2015) sampled at 10 evenly spaced
 * points; linear interpolation between them stays within a few levels of the
 * 256-entry table and keeps the map perceptually uniform. */
static const uint8_t VIRIDIS[10][3] = {
    {0x44, 0x01, 0x54}, {0x48, 0x28, 0x78}, {0x3e, 0x49, 0x89}, {0x31, 0x68, 0x8e},
    {0x26, 0x82, 0x8e}, {0x1f, 0x9e, 0x89}, {0x35, 0xb7, 0x79}, {0x6e, 0xce, 0x58},
    {0xb5, 0xde, 0x2b}, {0xfd, 0xe7, 0x25},
};
static const uint8_t NAN_RGB[3] = {0xb0, 0xb0, 0xb0};

void render_colormap(double t, uint8_t rgb[3]) {
    if (!(t > 0)) /* also NaN -> 0 */
        t = 0;
    if (t > 1)
        t = 1;
    double x = t * 9;
    int k = (int)x;
    if (k > 8)
        k = 8;
    double f = x - k;
    for (int c = 0; c < 3; c++)
        rgb[c] = (uint8_t)lround(VIRIDIS[k][c] + f * (VIRIDIS[k + 1][c] - VIRIDIS[k][c]));
}

static void weight_rgb(float w, float vmax, uint8_t rgb[3]) {
    if (isnan(w))
        memcpy(rgb, NAN_RGB, 3);
    else
        render_colormap((double)w / vmax, rgb);
}

/* ---- UTF-8 --------------------------------------------------------------- */

/* Decodes one code point of s (strict: no overlongs, surrogates or values
 * past U+10FFFF).  Returns the bytes used (>= 1); *cp = 0xFFFD if invalid. */
static int utf8_next(const unsigned char *s, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (c >= 0xf5 || n == 0) {
        *cp = 0xfffd;
        return 1;
    }
    uint32_t v = c & (0x7f >> n);
    for (int k = 1; k < n; k++) {
        if ((s[k] & 0xc0) != 0x80) {
            *cp = 0xfffd;
            return k;
        }
        v = v << 6 | (s[k] & 0x3f);
    }
    if ((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > 0x10ffff)) ||
        (v >= 0xd800 && v <= 0xdfff) || v == 0xfffe || v == 0xffff)
        v = 0xfffd;
    *cp = v;
    return n;
}

/* 1 when s is non-empty printable ASCII (what the bitmap font can draw). */
static int is_ascii_label(const char *s) {
    if (!*s)
        return 0;
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            return 0;
    return 1;
}

/* Width in SVG pixels of s at font size fz, truncated to max_cp code
 * points (+ the ellipsis): East Asian wide characters 1 em, the rest about 0.6 em. */
static int svg_text_width(const char *s, int fz, int max_cp) {
    double w = 0;
    int n = 0;
    const unsigned char *p = (const unsigned char *)s;
    while (*p && n < max_cp + 1) {
        uint32_t cp;
        p += utf8_next(p, &cp);
        w += (cp >= 0x1100 && cp != 0xfffd) ? 1.0 : 0.6;
        n++;
    }
    return (int)ceil(w * fz);
}

/* Writes s as XML character data / attribute value: & < > " ' escaped,
 * invalid UTF-8 and control characters replaced by U+FFFD; at most max_cp
 * code points, then an ellipsis. */
static void svg_escape(FILE *f, const char *s, int max_cp) {
    const unsigned char *p = (const unsigned char *)s;
    int n = 0;
    while (*p) {
        if (n == max_cp) {
            fputs("\xe2\x80\xa6", f); /* U+2026 */
            return;
        }
        uint32_t cp;
        int k = utf8_next(p, &cp);
        if (cp == 0xfffd || cp < 0x20 || cp == 0x7f)
            fputs("\xef\xbf\xbd", f);
        else if (cp == '&')
            fputs("&amp;", f);
        else if (cp == '<')
            fputs("&lt;", f);
        else if (cp == '>')
            fputs("&gt;", f);
        else if (cp == '"')
            fputs("&quot;", f);
        else if (cp == '\'')
            fputs("&#39;", f);
        else
            fwrite(p, 1, (size_t)k, f);
        p += k;
        n++;
    }
}

/* ---- the 5x7 bitmap font (printable ASCII) --------------------------------- */

/* Columns left to right, bit 0 = top row, bit 7 the descender row of
 * g j p q y; drawn in a 6x8 cell. */
static const uint8_t FONT5X7[95][5] = {
    {0x00, 0x00, 0x00, 0x00, 0x00}, {0x00, 0x00, 0x5f, 0x00, 0x00}, /*   ! */
    {0x00, 0x07, 0x00, 0x07, 0x00}, {0x14, 0x7f, 0x14, 0x7f, 0x14}, /* " # */
    {0x24, 0x2a, 0x7f, 0x2a, 0x12}, {0x23, 0x13, 0x08, 0x64, 0x62}, /* $ % */
    {0x36, 0x49, 0x55, 0x22, 0x50}, {0x00, 0x05, 0x03, 0x00, 0x00}, /* & ' */
    {0x00, 0x1c, 0x22, 0x41, 0x00}, {0x00, 0x41, 0x22, 0x1c, 0x00}, /* ( ) */
    {0x14, 0x08, 0x3e, 0x08, 0x14}, {0x08, 0x08, 0x3e, 0x08, 0x08}, /* * + */
    {0x00, 0x50, 0x30, 0x00, 0x00}, {0x08, 0x08, 0x08, 0x08, 0x08}, /* , - */
    {0x00, 0x60, 0x60, 0x00, 0x00}, {0x20, 0x10, 0x08, 0x04, 0x02}, /* . / */
    {0x3e, 0x51, 0x49, 0x45, 0x3e}, {0x00, 0x42, 0x7f, 0x40, 0x00}, /* 0 1 */
    {0x42, 0x61, 0x51, 0x49, 0x46}, {0x21, 0x41, 0x45, 0x4b, 0x31}, /* 2 3 */
    {0x18, 0x14, 0x12, 0x7f, 0x10}, {0x27, 0x45, 0x45, 0x45, 0x39}, /* 4 5 */
    {0x3c, 0x4a, 0x49, 0x49, 0x30}, {0x01, 0x71, 0x09, 0x05, 0x03}, /* 6 7 */
    {0x36, 0x49, 0x49, 0x49, 0x36}, {0x06, 0x49, 0x49, 0x29, 0x1e}, /* 8 9 */
    {0x00, 0x36, 0x36, 0x00, 0x00}, {0x00, 0x56, 0x36, 0x00, 0x00}, /* : ; */
    {0x08, 0x14, 0x22, 0x41, 0x00}, {0x14, 0x14, 0x14, 0x14, 0x14}, /* < = */
    {0x00, 0x41, 0x22, 0x14, 0x08}, {0x02, 0x01, 0x51, 0x09, 0x06}, /* > ? */
    {0x32, 0x49, 0x79, 0x41, 0x3e}, {0x7e, 0x11, 0x11, 0x11, 0x7e}, /* @ A */
    {0x7f, 0x49, 0x49, 0x49, 0x36}, {0x3e, 0x41, 0x41, 0x41, 0x22}, /* B C */
    {0x7f, 0x41, 0x41, 0x22, 0x1c}, {0x7f, 0x49, 0x49, 0x49, 0x41}, /* D E */
    {0x7f, 0x09, 0x09, 0x09, 0x01}, {0x3e, 0x41, 0x49, 0x49, 0x7a}, /* F G */
    {0x7f, 0x08, 0x08, 0x08, 0x7f}, {0x00, 0x41, 0x7f, 0x41, 0x00}, /* H I */
    {0x20, 0x40, 0x41, 0x3f, 0x01}, {0x7f, 0x08, 0x14, 0x22, 0x41}, /* J K */
    {0x7f, 0x40, 0x40, 0x40, 0x40}, {0x7f, 0x02, 0x0c, 0x02, 0x7f}, /* L M */
    {0x7f, 0x04, 0x08, 0x10, 0x7f}, {0x3e, 0x41, 0x41, 0x41, 0x3e}, /* N O */
    {0x7f, 0x09, 0x09, 0x09, 0x06}, {0x3e, 0x41, 0x51, 0x21, 0x5e}, /* P Q */
    {0x7f, 0x09, 0x19, 0x29, 0x46}, {0x46, 0x49, 0x49, 0x49, 0x31}, /* R S */
    {0x01, 0x01, 0x7f, 0x01, 0x01}, {0x3f, 0x40, 0x40, 0x40, 0x3f}, /* T U */
    {0x1f, 0x20, 0x40, 0x20, 0x1f}, {0x3f, 0x40, 0x38, 0x40, 0x3f}, /* V W */
    {0x63, 0x14, 0x08, 0x14, 0x63}, {0x07, 0x08, 0x70, 0x08, 0x07}, /* X Y */
    {0x61, 0x51, 0x49, 0x45, 0x43}, {0x00, 0x7f, 0x41, 0x41, 0x00}, /* Z [ */
    {0x02, 0x04, 0x08, 0x10, 0x20}, {0x00, 0x41, 0x41, 0x7f, 0x00}, /* \ ] */
    {0x04, 0x02, 0x01, 0x02, 0x04}, {0x40, 0x40, 0x40, 0x40, 0x40}, /* ^ _ */
    {0x00, 0x01, 0x02, 0x04, 0x00}, {0x20, 0x54, 0x54, 0x54, 0x78}, /* ` a */
    {0x7f, 0x48, 0x44, 0x44, 0x38}, {0x38, 0x44, 0x44, 0x44, 0x20}, /* b c */
    {0x38, 0x44, 0x44, 0x48, 0x7f}, {0x38, 0x54, 0x54, 0x54, 0x18}, /* d e */
    {0x08, 0x7e, 0x09, 0x01, 0x02}, {0x18, 0xa4, 0xa4, 0xa4, 0x7c}, /* f g */
    {0x7f, 0x08, 0x04, 0x04, 0x78}, {0x00, 0x44, 0x7d, 0x40, 0x00}, /* h i */
    {0x40, 0x80, 0x84, 0x7d, 0x00}, {0x7f, 0x10, 0x28, 0x44, 0x00}, /* j k */
    {0x00, 0x41, 0x7f, 0x40, 0x00}, {0x7c, 0x04, 0x18, 0x04, 0x78}, /* l m */
    {0x7c, 0x08, 0x04, 0x04, 0x78}, {0x38, 0x44, 0x44, 0x44, 0x38}, /* n o */
    {0xfc, 0x24, 0x24, 0x24, 0x18}, {0x18, 0x24, 0x24, 0x18, 0xfc}, /* p q */
    {0x7c, 0x08, 0x04, 0x04, 0x08}, {0x48, 0x54, 0x54, 0x54, 0x20}, /* r s */
    {0x04, 0x3f, 0x44, 0x40, 0x20}, {0x3c, 0x40, 0x40, 0x20, 0x7c}, /* t u */
    {0x1c, 0x20, 0x40, 0x20, 0x1c}, {0x3c, 0x40, 0x30, 0x40, 0x3c}, /* v w */
    {0x44, 0x28, 0x10, 0x28, 0x44}, {0x9c, 0xa0, 0xa0, 0xa0, 0x7c}, /* x y */
    {0x44, 0x64, 0x54, 0x4c, 0x44}, {0x00, 0x08, 0x36, 0x41, 0x00}, /* z { */
    {0x00, 0x00, 0x7f, 0x00, 0x00}, {0x00, 0x41, 0x36, 0x08, 0x00}, /* | } */
    {0x08, 0x04, 0x08, 0x10, 0x08},                                 /* ~   */
};

/* ---- layout ---------------------------------------------------------------- */

typedef struct layout {
    int64_t H, L, S, P;  /* heads, queries, keys, panels                      */
    int svg;             /* labels measured for SVG (1) or the bitmap font (0) */
    int cell;            /* cell side, px                                     */
    int fs;              /* bitmap font scale: glyph 5fs x 7fs, advance 6fs   */
    int fz;              /* SVG font size, px                                 */
    int line;            /* text line height, px                              */
    int ylab_w;          /* query label column width                          */
    int xlab_h;          /* key label band height                             */
    int xlab_vertical;   /* key labels rotated (read upwards)                 */
    int ystep, xstep;    /* label every ystep-th row, xstep-th column         */
    int title_h, ptitle_h, footer_h;
    int panel_w, panel_h, ncols, nrows;
    int grid_x, grid_y;
    int legend_x, legend_y, legend_h, legend_w;
    int width, height;
    int index_labels;    /* PNG: some token was replaced by its index         */
    float vmax;
} layout;

/* The text a panel axis shows for token k: the label, or its index. */
static const char *axis_label(const layout *lo, const char *const *labels, int64_t k, char buf[24]) {
    if (labels && labels[k] && (lo->svg ? labels[k][0] != 0 : is_ascii_label(labels[k])))
        return labels[k];
    snprintf(buf, 24, "%lld", (long long)k);
    return buf;
}

static int text_width_n(const layout *lo, const char *s, int max) {
    if (lo->svg)
        return svg_text_width(s, lo->fz, max);
    size_t n = strlen(s);
    if (n > (size_t)max)
        n = (size_t)max;
    return (int)n * 6 * lo->fs - lo->fs;
}

static int text_width(const layout *lo, const char *s) {
    return text_width_n(lo, s, LABEL_MAX);
}

static int max_label_width(const layout *lo, const char *const *labels, int64_t n, int *replaced) {
    int w = 0;
    char buf[24];
    for (int64_t k = 0; k < n; k++) {
        const char *s = axis_label(lo, labels, k, buf);
        if (labels && s == buf)
            *replaced = 1;
        int t = text_width(lo, s);
        if (t > w)
            w = t;
    }
    return w;
}

static float scale_top(const render_maps *m) {
    if (m->vmax > 0 && isfinite(m->vmax))
        return m->vmax;
    float mx = 0;
    size_t n = (size_t)(m->H * m->L * m->S);
    for (size_t k = 0; k < n; k++)
        if (isfinite(m->attn_weights[k]) && m->attn_weights[k] > mx)
            mx = m->attn_weights[k];
    return mx > 0 ? mx : 1;
}

int64_t render_panel_count(const render_maps *m) {
    return m->H > 1 ? m->H + 1 : m->H;
}

static render_status check_maps(const render_maps *m, char *err, size_t errlen) {
    if (!m || !m->attn_weights) {
        set_err(err, errlen, "render: no weights");
        return RENDER_ERR_ARG;
    }
    if (m->H < 1 || m->L < 1 || m->S < 1 || m->H > 4096 || m->L > 65536 || m->S > 65536) {
        set_err(err, errlen, "render: weights shape (%lld,%lld,%lld) must be (H,L,S), each >= 1",
                (long long)m->H, (long long)m->L, (long long)m->S);
        return RENDER_ERR_ARG;
    }
    int64_t cells = render_panel_count(m) * m->L * m->S;
    if (cells > RENDER_MAX_CELLS) {
        set_err(err, errlen,
                "render: %lld cells (panels %lld x L %lld x S %lld) is more than the %lld a "
                "picture can show; use fewer tokens",
                (long long)cells, (long long)render_panel_count(m), (long long)m->L,
                (long long)m->S, (long long)RENDER_MAX_CELLS);
        return RENDER_ERR_ARG;
    }
    return RENDER_OK;
}

static void layout_make(const render_maps *m, int svg, layout *lo) {
    memset(lo, 0, sizeof *lo);
    lo->H = m->H, lo->L = m->L, lo->S = m->S, lo->P = render_panel_count(m), lo->svg = svg;
    int64_t n = m->L > m->S ? m->L : m->S;
    int64_t c = 384 / n;
    lo->cell = c > 32 ? 32 : c < 2 ? 2 : (int)c;
    lo->fs = lo->cell >= 14 ? 2 : 1;
    lo->fz = 7 * lo->fs;
    lo->line = 8 * lo->fs;
    lo->vmax = scale_top(m);

    int replaced = 0;
    lo->ylab_w = max_label_width(lo, m->query_labels, m->L, &replaced) + 8;
    int xw = max_label_width(lo, m->key_labels, m->S, &replaced);
    lo->index_labels = replaced && !svg;
    lo->xlab_vertical = xw > lo->cell - 2;
    lo->xlab_h = (lo->xlab_vertical ? xw : lo->line) + 8;
    lo->ystep = (lo->line + lo->cell - 1) / lo->cell;
    lo->xstep = lo->xlab_vertical ? lo->ystep : (xw + 4 + lo->cell - 1) / lo->cell;

    lo->title_h = m->title ? lo->line + 14 : 0;
    lo->ptitle_h = lo->line + 10;
    lo->footer_h = lo->index_labels ? lo->line + 8 : 0;
    int map_w = (int)m->S * lo->cell, map_h = (int)m->L * lo->cell;
    int ptw = text_width(lo, "average") + 8;
    lo->panel_w = lo->ylab_w + (map_w > ptw ? map_w : ptw) + PANEL_GAP;
    lo->panel_h = lo->ptitle_h + map_h + lo->xlab_h + PANEL_GAP / 2;
    lo->ncols = lo->P <= 4 ? (int)lo->P : (int)ceil(sqrt((double)lo->P));
    lo->nrows = (int)((lo->P + lo->ncols - 1) / lo->ncols);
    lo->grid_x = MARGIN;
    lo->grid_y = MARGIN + lo->title_h;

    lo->legend_x = lo->grid_x + lo->ncols * lo->panel_w;
    lo->legend_y = lo->grid_y + lo->ptitle_h;
    lo->legend_h = map_h > 128 ? map_h : 128;
    lo->legend_w = LEGEND_BAR + 6 + text_width(lo, "0.000") + MARGIN;
    int wtitle = m->title ? MARGIN * 2 + text_width_n(lo, m->title, TITLE_MAX) : 0;
    int wfoot = lo->index_labels ? MARGIN * 2 + text_width_n(lo, INDEX_NOTE, TITLE_MAX) : 0;
    if (wtitle < wfoot)
        wtitle = wfoot;
    lo->width = lo->legend_x + lo->legend_w;
    if (lo->width < wtitle)
        lo->width = wtitle;
    int bottom = lo->grid_y + lo->nrows * lo->panel_h;
    int lbottom = lo->legend_y + lo->legend_h + lo->line;
    lo->height = (bottom > lbottom ? bottom : lbottom) + lo->footer_h + MARGIN;
}

/* Top-left pixel of panel p's map. */
static void map_origin(const layout *lo, int64_t p, int *x, int *y) {
    int col = (int)(p % lo->ncols), row = (int)(p / lo->ncols);
    *x = lo->grid_x + col * lo->panel_w + lo->ylab_w;
    *y = lo->grid_y + row * lo->panel_h + lo->ptitle_h;
}

static void panel_title(const layout *lo, int64_t p, char buf[32]) {
    if (p < lo->H)
        snprintf(buf, 32, "head %lld", (long long)p);
    else
        snprintf(buf, 32, "average");
}

/* Legend ticks: 0, step, 2 step, ... <= vmax with step 1, 2 or 5 x 10^k,
 * about `want` of them. */
static int legend_ticks(float vmax, int want, double *ticks, int max) {
    double raw = vmax / (want > 1 ? want : 1), mag = pow(10, floor(log10(raw))), nrm = raw / mag;
    double step = (nrm < 1.5 ? 1 : nrm < 3 ? 2 : nrm < 7 ? 5 : 10) * mag;
    int n = 0;
    for (int k = 0; n < max; k++) {
        double t = k * step;
        if (t > vmax * (1 + 1e-6))
            break;
        ticks[n++] = t;
    }
    return n;
}

/* A legend tick as both writers draw it: its pixel row and its label. */
typedef struct legend_tick {
    int y;
    char label[32];
} legend_tick;

/* The ticks of lo's legend (at most 16); their count. */
static int legend_tick_list(const layout *lo, legend_tick *out) {
    double ticks[16];
    int nt = legend_ticks(lo->vmax, lo->legend_h / (3 * lo->line) + 1, ticks, 16);
    for (int k = 0; k < nt; k++) {
        out[k].y = lo->legend_y + lo->legend_h - (int)lround(ticks[k] / lo->vmax * lo->legend_h);
        snprintf(out[k].label, sizeof out[k].label, "%.3g", ticks[k]);
    }
    return nt;
}

/* Panel p's weight (i,j): a head's, or the mean over heads. */
static float panel_weight(const render_maps *m, int64_t p, int64_t i, int64_t j) {
    if (p < m->H)
        return m->attn_weights[(p * m->L + i) * m->S + j];
    double s = 0;
    for (int64_t h = 0; h < m->H; h++)
        s += m->attn_weights[(h * m->L + i) * m->S + j];
    return (float)(s / m->H);
}

render_status render_cell_box(const render_maps *m, int64_t p, int64_t i, int64_t j, render_box *box) {
    if (check_maps(m, NULL, 0) || p < 0 || p >= render_panel_count(m) || i < 0 || i >= m->L ||
        j < 0 || j >= m->S || !box)
        return RENDER_ERR_ARG;
    layout lo;
    layout_make(m, 0, &lo);
    int x, y;
    map_origin(&lo, p, &x, &y);
    box->x = x + (int)j * lo.cell;
    box->y = y + (int)i * lo.cell;
    box->w = box->h = lo.cell;
    return RENDER_OK;
}

/* ---- SVG ------------------------------------------------------------------- */

/* Text centred on y, at most max code points. */
static void svg_text_n(FILE *f, int x, int y, const char *anchor, int fz, const char *s, int max) {
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"%d\" text-anchor=\"%s\" dominant-baseline=\"central\">",
            x, y, fz, anchor);
    svg_escape(f, s, max);
    fputs("</text>\n", f);
}

static void svg_text(FILE *f, int x, int y, const char *anchor, int fz, const char *s) {
    svg_text_n(f, x, y, anchor, fz, s, LABEL_MAX);
}

static void svg_panel(FILE *f, const render_maps *m, const layout *lo, int64_t p) {
    int x0, y0;
    char buf[32], lb[24], kb[24];
    map_origin(lo, p, &x0, &y0);
    panel_title(lo, p, buf);
    fprintf(f, "<g class=\"panel\" data-p=\"%lld\">\n", (long long)p);
    fprintf(f, "<text class=\"panel-title\" x=\"%d\" y=\"%d\" font-size=\"%d\" font-weight=\"bold\" "
               "text-anchor=\"middle\" dominant-baseline=\"central\">%s</text>\n",
            x0 + (int)m->S * lo->cell / 2, y0 - lo->ptitle_h / 2, lo->fz + 2, buf);
    fputs("<g shape-rendering=\"crispEdges\">\n", f);
    for (int64_t i = 0; i < m->L; i++) {
        for (int64_t j = 0; j < m->S; j++) {
            float w = panel_weight(m, p, i, j);
            uint8_t c[3];
            weight_rgb(w, lo->vmax, c);
            fprintf(f, "<rect class=\"cell\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                       "fill=\"#%02x%02x%02x\" data-p=\"%lld\" data-i=\"%lld\" data-j=\"%lld\" "
                       "data-w=\"%.6g\"><title>",
                    x0 + (int)j * lo->cell, y0 + (int)i * lo->cell, lo->cell, lo->cell, c[0], c[1],
                    c[2], (long long)p, (long long)i, (long long)j, (double)w);
            svg_escape(f, axis_label(lo, m->query_labels, i, lb), LABEL_MAX);
            fputs(" \xe2\x86\x92 ", f); /* U+2192 */
            svg_escape(f, axis_label(lo, m->key_labels, j, kb), LABEL_MAX);
            fprintf(f, ": %.4f</title></rect>\n", (double)w);
        }
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n",
            x0, y0, (int)m->S * lo->cell, (int)m->L * lo->cell);
    fputs("</g>\n", f);
    for (int64_t i = 0; i < m->L; i += lo->ystep)
        svg_text(f, x0 - 5, y0 + (int)i * lo->cell + lo->cell / 2, "end", lo->fz,
                 axis_label(lo, m->query_labels, i, lb));
    int yb = y0 + (int)m->L * lo->cell + 5;
    for (int64_t j = 0; j < m->S; j += lo->xstep) {
        int cx = x0 + (int)j * lo->cell + lo->cell / 2;
        const char *s = axis_label(lo, m->key_labels, j, kb);
        if (lo->xlab_vertical) {
            fprintf(f, "<text x=\"0\" y=\"0\" transform=\"translate(%d,%d) rotate(-90)\" font-size=\"%d\" "
                       "text-anchor=\"end\" dominant-baseline=\"central\">", cx, yb, lo->fz);
            svg_escape(f, s, LABEL_MAX);
            fputs("</text>\n", f);
        } else {
            svg_text(f, cx, yb + lo->line / 2, "middle", lo->fz, s);
        }
    }
    fputs("</g>\n", f);
}

static void svg_legend(FILE *f, const layout *lo) {
    fputs("<g class=\"legend\">\n<defs><linearGradient id=\"viridis\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n", f);
    for (int k = 0; k < 10; k++)
        fprintf(f, "<stop offset=\"%.4f\" stop-color=\"#%02x%02x%02x\"/>\n", k / 9.0, VIRIDIS[k][0],
                VIRIDIS[k][1], VIRIDIS[k][2]);
    fputs("</linearGradient></defs>\n", f);
    int x = lo->legend_x, y = lo->legend_y, h = lo->legend_h;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"url(#viridis)\" stroke=\"#444\"/>\n",
            x, y, LEGEND_BAR, h);
    svg_text(f, x, y - lo->line / 2 - 4, "start", lo->fz, "weight");
    legend_tick t[16];
    for (int k = 0, nt = legend_tick_list(lo, t); k < nt; k++) {
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#444\"/>\n", x + LEGEND_BAR,
                t[k].y, x + LEGEND_BAR + 4, t[k].y);
        svg_text(f, x + LEGEND_BAR + 6, t[k].y, "start", lo->fz, t[k].label);
    }
    fputs("</g>\n", f);
}

/* Closes a safe file (keep: commit it) and reports a failure in err. */
static render_status finish_file(mha_safe_file *out, int keep, char *err, size_t errlen) {
    if (mha_safe_file_close(out, keep) != MHA_OK) {
        set_err(err, errlen, "%s", mha_last_error());
        return RENDER_ERR_IO;
    }
    return RENDER_OK;
}

render_status render_svg_write(const render_maps *m, const char *path, char *err, size_t errlen) {
    render_status st = check_maps(m, err, errlen);
    if (st)
        return st;
    layout lo;
    layout_make(m, 1, &lo);
    mha_safe_file *out;
    if (mha_safe_file_open(&out, path) != MHA_OK) {
        set_err(err, errlen, "%s", mha_last_error());
        return RENDER_ERR_IO;
    }
    FILE *f = mha_safe_file_stream(out);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"'Noto Sans CJK SC','Source Han Sans SC','PingFang SC','Microsoft YaHei',"
               "DejaVu Sans,sans-serif\" fill=\"#222\">\n",
            lo.width, lo.height, lo.width, lo.height);
    fprintf(f, "<desc>attention weights: H=%lld heads, L=%lld queries (rows), S=%lld keys (columns); "
               "colour scale viridis 0..%.4g</desc>\n",
            (long long)m->H, (long long)m->L, (long long)m->S, (double)lo.vmax);
    fprintf(f, "<rect class=\"background\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", lo.width, lo.height);
    if (m->title) {
        fprintf(f, "<text class=\"title\" x=\"%d\" y=\"%d\" font-size=\"%d\" font-weight=\"bold\" "
                   "dominant-baseline=\"central\">", MARGIN, MARGIN + lo.line / 2 + 2, lo.fz + 3);
        svg_escape(f, m->title, TITLE_MAX);
        fputs("</text>\n", f);
    }
    for (int64_t p = 0; p < lo.P; p++)
        svg_panel(f, m, &lo, p);
    svg_legend(f, &lo);
    fputs("</svg>\n", f);
    return finish_file(out, 1, err, errlen);
}

/* ---- raster ---------------------------------------------------------------- */

static void fill_rect(render_image *img, int x, int y, int w, int h, const uint8_t c[3]) {
    int x1 = x + w, y1 = y + h;
    if (x < 0)
        x = 0;
    if (y < 0)
        y = 0;
    if (x1 > img->width)
        x1 = img->width;
    if (y1 > img->height)
        y1 = img->height;
    for (int yy = y; yy < y1; yy++)
        for (int xx = x; xx < x1; xx++)
            memcpy(img->rgb + ((size_t)yy * img->width + xx) * 3, c, 3);
}

static void frame_rect(render_image *img, int x, int y, int w, int h, const uint8_t c[3]) {
    fill_rect(img, x - 1, y - 1, w + 2, 1, c);
    fill_rect(img, x - 1, y + h, w + 2, 1, c);
    fill_rect(img, x - 1, y, 1, h, c);
    fill_rect(img, x + w, y, 1, h, c);
}

static const uint8_t INK[3] = {0x22, 0x22, 0x22};
static const uint8_t FRAME[3] = {0x44, 0x44, 0x44};

/* Draws ASCII s (at most max characters) with its top-left at (x,y);
 * vertical: reading upwards, (x,y) the bottom-left of the first character. */
static void draw_text_n(render_image *img, int x, int y, const char *s, int max, int fs, int vertical) {
    for (int k = 0; s[k] && k < max; k++) {
        unsigned ch = (unsigned char)s[k];
        if (ch < 0x20 || ch > 0x7e)
            ch = '?';
        const uint8_t *g = FONT5X7[ch - 0x20];
        for (int gx = 0; gx < 5; gx++)
            for (int gy = 0; gy < 8; gy++) {
                if (!(g[gx] >> gy & 1))
                    continue;
                if (vertical)
                    fill_rect(img, x + gy * fs, y - (k * 6 + gx + 1) * fs, fs, fs, INK);
                else
                    fill_rect(img, x + (k * 6 + gx) * fs, y + gy * fs, fs, fs, INK);
            }
    }
}

static void draw_text(render_image *img, int x, int y, const char *s, int fs, int vertical) {
    draw_text_n(img, x, y, s, LABEL_MAX, fs, vertical);
}

static void raster_panel(render_image *img, const render_maps *m, const layout *lo, int64_t p) {
    int x0, y0;
    char buf[32], lb[24];
    map_origin(lo, p, &x0, &y0);
    panel_title(lo, p, buf);
    int mw = (int)m->S * lo->cell, mh = (int)m->L * lo->cell;
    draw_text(img, x0 + mw / 2 - text_width(lo, buf) / 2, y0 - lo->ptitle_h + 3, buf, lo->fs, 0);
    for (int64_t i = 0; i < m->L; i++)
        for (int64_t j = 0; j < m->S; j++) {
            uint8_t c[3];
            weight_rgb(panel_weight(m, p, i, j), lo->vmax, c);
            fill_rect(img, x0 + (int)j * lo->cell, y0 + (int)i * lo->cell, lo->cell, lo->cell, c);
        }
    frame_rect(img, x0, y0, mw, mh, FRAME);
    int gh = 7 * lo->fs;
    for (int64_t i = 0; i < m->L; i += lo->ystep) {
        const char *s = axis_label(lo, m->query_labels, i, lb);
        draw_text(img, x0 - 5 - text_width(lo, s), y0 + (int)i * lo->cell + (lo->cell - gh) / 2, s,
                  lo->fs, 0);
    }
    int yb = y0 + mh + 5;
    for (int64_t j = 0; j < m->S; j += lo->xstep) {
        const char *s = axis_label(lo, m->key_labels, j, lb);
        int cx = x0 + (int)j * lo->cell + lo->cell / 2;
        if (lo->xlab_vertical)
            draw_text(img, cx - gh / 2, yb + text_width(lo, s), s, lo->fs, 1);
        else
            draw_text(img, cx - text_width(lo, s) / 2, yb, s, lo->fs, 0);
    }
}

static void raster_legend(render_image *img, const layout *lo) {
    int x = lo->legend_x, y = lo->legend_y, h = lo->legend_h;
    for (int r = 0; r < h; r++) {
        uint8_t c[3];
        render_colormap((h - 1 - r) / (double)(h > 1 ? h - 1 : 1), c);
        fill_rect(img, x, y + r, LEGEND_BAR, 1, c);
    }
    frame_rect(img, x, y, LEGEND_BAR, h, FRAME);
    draw_text(img, x, y - lo->line - 4, "weight", lo->fs, 0);
    legend_tick t[16];
    for (int k = 0, nt = legend_tick_list(lo, t); k < nt; k++) {
        fill_rect(img, x + LEGEND_BAR, t[k].y, 4, 1, FRAME);
        draw_text(img, x + LEGEND_BAR + 6, t[k].y - 7 * lo->fs / 2, t[k].label, lo->fs, 0);
    }
}

/* A white w x h image in img. */
static render_status image_make(render_image *img, int w, int h, char *err, size_t errlen) {
    img->rgb = malloc((size_t)w * h * 3);
    if (!img->rgb) {
        set_err(err, errlen, "render: out of memory for a %dx%d picture", w, h);
        return RENDER_ERR_NOMEM;
    }
    img->width = w;
    img->height = h;
    memset(img->rgb, 0xff, (size_t)w * h * 3);
    return RENDER_OK;
}

render_status render_raster(const render_maps *m, render_image *img, char *err, size_t errlen) {
    if (!img)
        return RENDER_ERR_ARG;
    img->width = img->height = 0;
    img->rgb = NULL;
    render_status st = check_maps(m, err, errlen);
    if (st)
        return st;
    layout lo;
    layout_make(m, 0, &lo);
    if ((int64_t)lo.width * lo.height > RENDER_MAX_PIXELS) {
        set_err(err, errlen, "render: a %dx%d picture is too large; use fewer tokens", lo.width, lo.height);
        return RENDER_ERR_ARG;
    }
    if ((st = image_make(img, lo.width, lo.height, err, errlen)))
        return st;
    if (m->title)
        draw_text_n(img, MARGIN, MARGIN + 2, m->title, TITLE_MAX, lo.fs, 0);
    for (int64_t p = 0; p < lo.P; p++)
        raster_panel(img, m, &lo, p);
    raster_legend(img, &lo);
    if (lo.index_labels)
        draw_text_n(img, MARGIN, lo.height - MARGIN - lo.line, INDEX_NOTE, TITLE_MAX, lo.fs, 0);
    return RENDER_OK;
}

void render_image_free(render_image *img) {
    if (!img)
        return;
    free(img->rgb);
    img->rgb = NULL;
    img->width = img->height = 0;
}

/* ---- PNG ------------------------------------------------------------------- */

#ifdef MHA_HAVE_PNG
typedef struct png_errctx {
    char *err;
    size_t errlen;
    const char *path;
} png_errctx;

static void png_on_error(png_structp png, png_const_charp msg) {
    png_errctx *c = png_get_error_ptr(png);
    set_err(c->err, c->errlen, "%s: libpng: %s", c->path, msg);
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png, (void)msg;
}

int render_png_available(void) {
    return 1;
}

/* Encodes img (then freed) into path as PNG, tEXt Software = software. */
static render_status png_write(render_image *img, const char *path, const char *software,
                               char *err, size_t errlen) {
    mha_safe_file *out;
    if (mha_safe_file_open(&out, path) != MHA_OK) {
        set_err(err, errlen, "%s", mha_last_error());
        render_image_free(img);
        return RENDER_ERR_IO;
    }
    FILE *f = mha_safe_file_stream(out);
    png_errctx ctx = {err, errlen, path};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &ctx, png_on_error, png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        set_err(err, errlen, "%s: libpng: out of memory", path);
        png_destroy_write_struct(png ? &png : NULL, NULL);
        mha_safe_file_close(out, 0);
        render_image_free(img);
        return RENDER_ERR_NOMEM;
    }
    /* png, info, out, f and img are not modified after setjmp: safe to use after longjmp. */
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        mha_safe_file_close(out, 0); /* removes only the temporary */
        render_image_free(img);
        return RENDER_ERR_IO;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)img->width, (png_uint_32)img->height, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_text text[1];
    memset(text, 0, sizeof text);
    text[0].compression = PNG_TEXT_COMPRESSION_NONE;
    text[0].key = (png_charp) "Software";
    text[0].text = (png_charp)software;
    png_set_text(png, info, text, 1);
    png_write_info(png, info);
    for (int y = 0; y < img->height; y++)
        png_write_row(png, img->rgb + (size_t)y * img->width * 3);
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    render_image_free(img);
    return finish_file(out, 1, err, errlen);
}
#else
int render_png_available(void) {
    return 0;
}

static render_status png_write(render_image *img, const char *path, const char *software,
                               char *err, size_t errlen) {
    (void)img, (void)software;
    set_err(err, errlen, "%s: PNG output needs libpng, which this build lacks "
                         "(install libpng-dev, e.g. `make deps`, and rebuild; --svg works)", path);
    return RENDER_ERR_UNSUPPORTED;
}
#endif

render_status render_png_write(const render_maps *m, const char *path, char *err, size_t errlen) {
    render_image img = {0, 0, NULL};
    render_status st = render_png_available() ? render_raster(m, &img, err, errlen) : RENDER_OK;
    return st ? st : png_write(&img, path, "mha viz", err, errlen);
}

/* ---- line plots -------------------------------------------------------------
 * One frame (plot_frame_make) for both writers: the figure's size, the
 * plotting area's margins and the data ranges. */

enum { PLOT_W = 720, PLOT_H = 400, PLOT_L = 70, PLOT_R = 20, PLOT_T = 40, PLOT_B = 50 };

typedef struct plot_frame {
    double lo, hi; /* y range */
    double x0, x1; /* x range */
} plot_frame;

static render_status check_plot(const render_plot *p, char *err, size_t errlen) {
    if (!p || p->n < 0 || p->n > RENDER_MAX_POINTS || (p->n && !p->x) || !p->series ||
        p->nseries < 1 || p->nseries > RENDER_MAX_SERIES) {
        set_err(err, errlen, "render: a plot needs 0..%lld points and 1..%d series",
                (long long)RENDER_MAX_POINTS, RENDER_MAX_SERIES);
        return RENDER_ERR_ARG;
    }
    for (int s = 0; s < p->nseries; s++)
        if ((p->n && !p->series[s].y) || p->series[s].width < 1 || p->series[s].width > 4) {
            set_err(err, errlen, "render: series %d needs values and a width of 1..4", s);
            return RENDER_ERR_ARG;
        }
    return RENDER_OK;
}

static void plot_frame_make(const render_plot *p, plot_frame *f) {
    double lo = INFINITY, hi = -INFINITY;
    for (int s = 0; s < p->nseries; s++)
        for (int64_t i = 0; i < p->n; i++)
            if (isfinite(p->series[s].y[i]))
                lo = fmin(lo, p->series[s].y[i]), hi = fmax(hi, p->series[s].y[i]);
    if (!(hi > lo))
        lo = 0, hi = hi > 0 ? hi : 1;
    const double margin = lo - 0.05 * (hi - lo);
    f->lo = lo >= 0 ? fmax(0.0, margin) : margin, f->hi = hi;
    f->x0 = p->n ? (double)p->x[0] : 0;
    f->x1 = p->n > 1 ? (double)p->x[p->n - 1] : f->x0 + 1;
    if (!(f->x1 > f->x0))
        f->x1 = f->x0 + 1;
}

static double plot_px(const plot_frame *f, double x) {
    return PLOT_L + (x - f->x0) / (f->x1 - f->x0) * (PLOT_W - PLOT_L - PLOT_R);
}

static double plot_py(const plot_frame *f, double v) {
    return PLOT_T + (f->hi - v) / (f->hi - f->lo) * (PLOT_H - PLOT_T - PLOT_B);
}

/* Tick k of 0..4: its y value and x value. */
static void plot_tick(const plot_frame *f, int k, double *v, double *x) {
    *v = f->lo + (f->hi - f->lo) * k / 4.0;
    *x = f->x0 + (f->x1 - f->x0) * k / 4.0;
}

render_status render_plot_svg_write(const render_plot *p, const char *path, char *err,
                                    size_t errlen) {
    render_status st = check_plot(p, err, errlen);
    if (st)
        return st;
    plot_frame fr;
    plot_frame_make(p, &fr);
    mha_safe_file *out;
    if (mha_safe_file_open(&out, path) != MHA_OK) {
        set_err(err, errlen, "%s", mha_last_error());
        return RENDER_ERR_IO;
    }
    FILE *f = mha_safe_file_stream(out);
    const int pw = PLOT_W - PLOT_L - PLOT_R, ph = PLOT_H - PLOT_T - PLOT_B;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"DejaVu Sans,sans-serif\" fill=\"#222\">\n",
            PLOT_W, PLOT_H, PLOT_W, PLOT_H);
    fprintf(f, "<desc>line plot: %lld points, %d series</desc>\n", (long long)p->n, p->nseries);
    fprintf(f, "<rect class=\"background\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", PLOT_W, PLOT_H);
    if (p->title)
        svg_text_n(f, PLOT_W / 2, PLOT_T / 2, "middle", 15, p->title, TITLE_MAX);
    char buf[32];
    for (int k = 0; k <= 4; k++) { /* grid and ticks */
        double v, x;
        plot_tick(&fr, k, &v, &x);
        int y = (int)lround(plot_py(&fr, v));
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ddd\"/>\n", PLOT_L, y,
                PLOT_W - PLOT_R, y);
        snprintf(buf, sizeof buf, "%.3g", v);
        svg_text(f, PLOT_L - 6, y, "end", 12, buf);
        snprintf(buf, sizeof buf, "%.0f", x);
        svg_text(f, (int)lround(plot_px(&fr, x)), PLOT_H - PLOT_B + 14, "middle", 12, buf);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#000\"/>\n",
            PLOT_L, PLOT_T, pw, ph);
    if (p->xlabel)
        svg_text_n(f, PLOT_L + pw / 2, PLOT_H - 12, "middle", 12, p->xlabel, TITLE_MAX);
    if (p->ylabel) {
        fprintf(f, "<text x=\"0\" y=\"0\" transform=\"translate(16,%d) rotate(-90)\" font-size=\"12\" "
                   "text-anchor=\"middle\" dominant-baseline=\"central\">", PLOT_T + ph / 2);
        svg_escape(f, p->ylabel, TITLE_MAX);
        fputs("</text>\n", f);
    }
    for (int s = 0; s < p->nseries; s++) {
        const render_series *se = &p->series[s];
        fputs("<polyline class=\"series\" data-name=\"", f);
        svg_escape(f, se->name ? se->name : "", TITLE_MAX);
        fprintf(f, "\" fill=\"none\" stroke=\"#%02x%02x%02x\" stroke-width=\"%d\" points=\"",
                se->rgb[0], se->rgb[1], se->rgb[2], se->width);
        for (int64_t i = 0; i < p->n; i++)
            if (isfinite(se->y[i]))
                fprintf(f, "%.1f,%.1f ", plot_px(&fr, (double)p->x[i]), plot_py(&fr, se->y[i]));
        fputs("\"/>\n", f);
        if (se->name) { /* the legend, top right, in the series' colour */
            fprintf(f, "<g fill=\"#%02x%02x%02x\">", se->rgb[0], se->rgb[1], se->rgb[2]);
            svg_text_n(f, PLOT_W - PLOT_R - 6, PLOT_T + 10 + 14 * s, "end", 11, se->name, TITLE_MAX);
            fputs("</g>\n", f);
        }
    }
    fputs("</svg>\n", f);
    return finish_file(out, 1, err, errlen);
}

/* A line of width w from (x0,y0) to (x1,y1). */
static void draw_line(render_image *img, double x0, double y0, double x1, double y1, int w,
                      const uint8_t c[3]) {
    const int n = (int)fmax(fabs(x1 - x0), fabs(y1 - y0)) + 1;
    for (int i = 0; i <= n; i++) {
        double t = (double)i / n;
        fill_rect(img, (int)lround(x0 + t * (x1 - x0)), (int)lround(y0 + t * (y1 - y0)), w, w, c);
    }
}

render_status render_plot_raster(const render_plot *p, render_image *img, char *err,
                                 size_t errlen) {
    static const uint8_t GRID[3] = {0xdd, 0xdd, 0xdd}, BLACK[3] = {0, 0, 0};
    if (!img)
        return RENDER_ERR_ARG;
    img->width = img->height = 0;
    img->rgb = NULL;
    render_status st = check_plot(p, err, errlen);
    if (st || (st = image_make(img, PLOT_W, PLOT_H, err, errlen)))
        return st;
    plot_frame fr;
    plot_frame_make(p, &fr);
    const int pw = PLOT_W - PLOT_L - PLOT_R, ph = PLOT_H - PLOT_T - PLOT_B, gh = 7;
    const int tw = 6; /* the 5x7 font's advance at size 1 */
    if (p->title)
        draw_text_n(img, PLOT_W / 2 - tw * (int)fmin(strlen(p->title), TITLE_MAX) / 2,
                    PLOT_T / 2 - gh / 2, p->title, TITLE_MAX, 1, 0);
    char buf[32];
    for (int k = 0; k <= 4; k++) {
        double v, x;
        plot_tick(&fr, k, &v, &x);
        int y = (int)lround(plot_py(&fr, v)), xp = (int)lround(plot_px(&fr, x));
        fill_rect(img, PLOT_L, y, pw, 1, GRID);
        snprintf(buf, sizeof buf, "%.3g", v);
        draw_text(img, PLOT_L - 6 - tw * (int)strlen(buf), y - gh / 2, buf, 1, 0);
        snprintf(buf, sizeof buf, "%.0f", x);
        draw_text(img, xp - tw * (int)strlen(buf) / 2, PLOT_H - PLOT_B + 8, buf, 1, 0);
    }
    if (p->xlabel)
        draw_text_n(img, PLOT_L + pw / 2 - tw * (int)fmin(strlen(p->xlabel), TITLE_MAX) / 2,
                    PLOT_H - 18, p->xlabel, TITLE_MAX, 1, 0);
    if (p->ylabel)
        draw_text_n(img, 12, PLOT_T + ph / 2 + tw * (int)fmin(strlen(p->ylabel), TITLE_MAX) / 2,
                    p->ylabel, TITLE_MAX, 1, 1);
    for (int s = 0; s < p->nseries; s++) {
        const render_series *se = &p->series[s];
        double px = 0, py = 0;
        int have = 0;
        for (int64_t i = 0; i < p->n; i++) {
            if (!isfinite(se->y[i]))
                continue;
            double x = plot_px(&fr, (double)p->x[i]), y = plot_py(&fr, se->y[i]);
            if (have)
                draw_line(img, px, py, x, y, se->width, se->rgb);
            px = x, py = y, have = 1;
        }
        if (se->name) { /* the legend: a stroke of the colour, then the name */
            int ly = PLOT_T + 10 + 14 * s,
                lx = PLOT_W - PLOT_R - 6 - tw * (int)fmin(strlen(se->name), TITLE_MAX);
            draw_line(img, lx - 22, ly, lx - 6, ly, se->width, se->rgb);
            draw_text_n(img, lx, ly - gh / 2, se->name, TITLE_MAX, 1, 0);
        }
    }
    frame_rect(img, PLOT_L, PLOT_T, pw, ph, BLACK);
    return RENDER_OK;
}

render_status render_plot_png_write(const render_plot *p, const char *path, char *err,
                                    size_t errlen) {
    render_image img = {0, 0, NULL};
    render_status st = render_png_available() ? render_plot_raster(p, &img, err, errlen) : RENDER_OK;
    return st ? st : png_write(&img, path, "mha train", err, errlen);
}

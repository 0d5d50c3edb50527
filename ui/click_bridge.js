(function () {
  const doc = window.parent.document;
  function attach() {
    doc.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot').forEach(function (gd) {
      if (gd.__specdecClick || !gd.on || !gd.emit) return;
      const meta = gd.layout && gd.layout.meta;
      if (!meta || !meta.specdec_click_selects) return;
      gd.__specdecClick = true;
      // A press and release on the same spot is a click on the point hovered when it was pressed. Only DOM
      // listeners here: plotly drops its own event handlers when Streamlit draws the chart again.
      let down = null;
      gd.addEventListener('mousedown', function (ev) {
        const hover = gd._hoverdata;
        const h = hover && hover.length ? hover[0] : null;
        // Only the fields a selected point carries: a hover point also holds the axes, which can't be sent.
        const point = h && {curveNumber: h.curveNumber, pointNumber: h.pointNumber, pointIndex: h.pointNumber,
                            x: h.x, y: h.y, customdata: h.customdata, data: h.data, fullData: h.fullData};
        down = {x: ev.clientX, y: ev.clientY, point: point};
      }, true);
      doc.addEventListener('mouseup', function (ev) {
        if (!down) return;
        const moved = Math.abs(ev.clientX - down.x) + Math.abs(ev.clientY - down.y);
        const point = down.point;
        down = null;
        if (moved > 3 || !point) return;
        // After plotly has handled the click (it clears the selection), select that point.
        doc.defaultView.setTimeout(function () { gd.emit('plotly_selected', {points: [point]}); }, 50);
      }, true);
    });
  }
  attach();
  new MutationObserver(attach).observe(doc.body, {childList: true, subtree: true});
})();

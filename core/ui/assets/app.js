// Berth dashboard: the only script of our own. It turns htmx's evaluation of
// code in attributes (hx-on, js: values) off: the extension below replaces
// the Function constructors htmx compiles such code with by ones that refuse.
// The Content-Security-Policy (no 'unsafe-eval') refuses it as well; this
// makes the refusal explicit and independent of the browser.
(function () {
  "use strict";
  function refuse() {
    throw new Error("berth: evaluating code from attributes is disabled");
  }
  htmx.registerExtension("berth-noeval", {
    init: function (api) {
      api.initSecurity(null, refuse, refuse);
    },
  });
})();

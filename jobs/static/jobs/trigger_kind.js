/* The job form shows only the fields of the chosen trigger kind (cron: expression, zone,
   DST menus; interval: seconds; one time: run at). The kinds' fields come from the radio
   buttons' data-kind-fields (jobs.rules.job.TRIGGER_KIND_FIELDS), so this file holds no
   copy of the rule; the server reads only the chosen kind's fields either way. */
(function () {
  "use strict";
  function setUp() {
    var radios = document.querySelectorAll('input[name="trigger_kind"]');
    if (!radios.length) return;
    var kinds = JSON.parse(radios[0].getAttribute("data-kind-fields") || "{}");
    function rowOf(field) {
      return document.querySelector(".form-row.field-" + field) ||
        document.querySelector(".fieldBox.field-" + field);
    }
    function show() {
      var chosen = document.querySelector('input[name="trigger_kind"]:checked');
      var kind = chosen ? chosen.value : null;
      Object.keys(kinds).forEach(function (k) {
        kinds[k].forEach(function (field) {
          var row = rowOf(field);
          if (row) row.style.display = kind !== null && k !== kind ? "none" : "";
        });
      });
    }
    radios.forEach(function (radio) { radio.addEventListener("change", show); });
    show();
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", setUp);
  } else {
    setUp();
  }
})();

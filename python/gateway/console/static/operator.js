// The operator view: an account form's model list is used only with "Only these"; a console user's
// account is asked for only for a member.
"use strict";
(() => {
  for (const fieldset of document.querySelectorAll("fieldset.models")) {
    const list = fieldset.querySelector(".model-list");
    const some = fieldset.querySelector('input[name="models"][value="some"]');
    const sync = () => list.classList.toggle("off", !some.checked);
    for (const radio of fieldset.querySelectorAll('input[name="models"]')) radio.addEventListener("change", sync);
    // Ticking a model means "only these".
    for (const box of list.querySelectorAll("input")) {
      box.addEventListener("change", () => { if (box.checked) { some.checked = true; sync(); } });
    }
    sync();
  }
  const role = document.getElementById("role");
  const account = document.getElementById("account-field");
  if (role && account) {
    const sync = () => {
      const member = role.value === "member";
      account.classList.toggle("off", !member);
      document.getElementById("account-choice").disabled = !member;
    };
    role.addEventListener("change", sync);
    sync();
  }
})();

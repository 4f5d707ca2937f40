"""uiautomator dump parsing: realistic screens map onto UIElement, and every bad input fails with a kind."""

from __future__ import annotations

import pytest

from actors.envs.adb.errors import DeviceOutputError
from actors.envs.adb.uixml import MAX_DEPTH, MAX_NODES, MAX_TEXT, MAX_XML_BYTES, parse_bounds, parse_dump
from common.types import UIElement

SCREEN = (1080, 2400)

SETTINGS = """<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>
<hierarchy rotation="0">
  <node index="0" text="" resource-id="" class="android.widget.FrameLayout" package="com.android.settings"
        content-desc="" checkable="false" checked="false" clickable="false" enabled="true" focusable="false"
        focused="false" scrollable="false" long-clickable="false" password="false" selected="false"
        bounds="[0,0][1080,2400]">
    <node index="0" text="Settings" resource-id="com.android.settings:id/homepage_title"
          class="android.widget.TextView" package="com.android.settings" content-desc="" checkable="false"
          checked="false" clickable="false" enabled="true" focusable="false" focused="false"
          scrollable="false" long-clickable="false" password="false" selected="false"
          bounds="[63,236][1017,394]" />
    <node index="1" text="" resource-id="com.android.settings:id/recycler_view"
          class="androidx.recyclerview.widget.RecyclerView" package="com.android.settings" content-desc=""
          checkable="false" checked="false" clickable="false" enabled="true" focusable="true" focused="false"
          scrollable="true" long-clickable="false" password="false" selected="false"
          bounds="[0,500][1080,2400]">
      <node index="0" text="" resource-id="" class="android.widget.LinearLayout" package="com.android.settings"
            content-desc="" checkable="false" checked="false" clickable="true" enabled="true" focusable="true"
            focused="false" scrollable="false" long-clickable="false" password="false" selected="false"
            bounds="[0,500][1080,700]">
        <node index="0" text="Network &amp; internet" resource-id="android:id/title"
              class="android.widget.TextView" package="com.android.settings" content-desc=""
              checkable="false" checked="false" clickable="false" enabled="true" focusable="false"
              focused="false" scrollable="false" long-clickable="false" password="false" selected="false"
              bounds="[200,530][800,600]" />
        <node index="1" text="" resource-id="" class="android.view.View" package="com.android.settings"
              content-desc="" checkable="false" checked="false" clickable="false" enabled="true"
              focusable="false" focused="false" scrollable="false" long-clickable="false" password="false"
              selected="false" bounds="[0,690][1080,700]" />
      </node>
      <node index="1" text="Airplane mode" resource-id="" class="android.widget.Switch"
            package="com.android.settings" content-desc="" checkable="true" checked="true" clickable="true"
            enabled="true" focusable="true" focused="false" scrollable="false" long-clickable="false"
            password="false" selected="false" bounds="[0,2300][1080,2600]" />
      <node index="2" text="Offscreen" resource-id="" class="android.widget.TextView"
            package="com.android.settings" content-desc="" bounds="[0,2500][1080,2700]" />
    </node>
  </node>
</hierarchy>"""

LOGIN = """<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>
<hierarchy rotation="0">
  <node index="0" text="" resource-id="com.example:id/user" class="android.widget.EditText"
        package="com.example" content-desc="" hint="Email" checkable="false" checked="false"
        clickable="true" enabled="true" focusable="true" focused="true" scrollable="false"
        long-clickable="true" password="false" selected="false" bounds="[60,400][1020,520]" />
  <node index="1" text="hunter2" resource-id="com.example:id/pass" class="android.widget.EditText"
        package="com.example" content-desc="" password="true" clickable="true" bounds="[60,560][1020,680]" />
  <node index="2" text="" resource-id="" class="android.widget.ImageButton" package="com.example"
        content-desc="Navigate up" clickable="true" bounds="[0,100][140,240]" />
  <node index="3" text="Hidden" class="android.widget.TextView" visible-to-user="false"
        bounds="[0,800][500,900]" />
  <node index="4" text="日本語 ✓ émoji 🙂" class="android.widget.TextView" bounds="[0,900][500,1000]" />
</hierarchy>"""


def test_settings_screen_maps_onto_uielements():
    els = parse_dump(SETTINGS.encode(), SCREEN)
    assert len(els) == 5, "the unlabeled divider and the off-screen row are dropped"
    title, recycler, row, network, airplane = els
    assert title == UIElement(
        "android.widget.TextView",
        text="Settings",
        resource_id="com.android.settings:id/homepage_title",
        bounds=(63, 236, 1017, 394),
    )
    assert recycler.scrollable and not recycler.clickable
    assert row.clickable and row.text == "" and row.bounds == (0, 500, 1080, 700)
    assert network.text == "Network & internet"
    assert airplane.checked and airplane.clickable
    assert airplane.bounds == (0, 2300, 1080, 2400), "clipped to the screen"
    assert airplane.center == (540, 2350)


def test_login_screen_hint_password_visibility_unicode():
    els = parse_dump(LOGIN, SCREEN)
    user, password, up, uni = els
    assert user.hint == "Email" and user.focused and user.clickable and user.label == "Email"
    assert password.text == "" and password.resource_id == "com.example:id/pass"
    assert up.content_desc == "Navigate up" and up.label == "Navigate up"
    assert uni.text == "日本語 ✓ émoji 🙂"
    assert all(e.text != "Hidden" for e in els)


def test_empty_hierarchy_is_no_elements():
    assert parse_dump(b"<hierarchy rotation='0'/>", SCREEN) == []


def test_missing_attributes_default():
    els = parse_dump(
        b'<hierarchy><node text="Hi" bounds="[0,0][10,10]"/><node text="x"/></hierarchy>', SCREEN
    )
    assert els == [UIElement("", text="Hi", bounds=(0, 0, 10, 10))]


def test_texts_are_capped_and_control_chars_dropped():
    long = "a" * (MAX_TEXT * 4)
    xml = f'<hierarchy><node text="{long}" content-desc="x&#9;y&#x1;z" bounds="[0,0][9,9]"/></hierarchy>'
    with pytest.raises(DeviceOutputError) as e:  # &#x1; is not legal XML 1.0
        parse_dump(xml, SCREEN)
    assert e.value.kind == "bad_xml"
    xml = f'<hierarchy><node text="{long}" content-desc="x&#9;y" bounds="[0,0][9,9]"/></hierarchy>'
    (el,) = parse_dump(xml, SCREEN)
    assert len(el.text) == MAX_TEXT and el.content_desc == "x\ty"


def test_latin1_declared_encoding_decodes():
    xml = "<?xml version='1.0' encoding='ISO-8859-1'?><hierarchy><node text='café' bounds='[0,0][5,5]'/></hierarchy>"
    (el,) = parse_dump(xml.encode("latin-1"), SCREEN)
    assert el.text == "café"


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"ERROR: could not get idle state.", "bad_xml"),
        (b"<hierarchy><node text='a'", "bad_xml"),
        (b"<hierarchy><node text='\xff\xfe'/></hierarchy>", "bad_xml"),
        (b"<html><body/></html>", "bad_root"),
        (
            b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]>'
            b"<hierarchy><node text='&lol2;' bounds='[0,0][1,1]'/></hierarchy>",
            "dtd",
        ),
        (b'<!doctype x SYSTEM "file:///etc/passwd"><hierarchy/>', "dtd"),
        (b'<hierarchy><!ENTITY x "y"></hierarchy>', "dtd"),
        (b"<hierarchy><node text='&xxe;' bounds='[0,0][1,1]'/></hierarchy>", "bad_xml"),
        (b"<hierarchy><node text='a' bounds='[0,0][10]'/></hierarchy>", "bad_bounds"),
        (b"<hierarchy><node text='a' bounds='[a,b][c,d]'/></hierarchy>", "bad_bounds"),
        (b"<hierarchy><node text='a' bounds='[0,0][99999999999,1]'/></hierarchy>", "bad_bounds"),
    ],
)
def test_bad_input_raises_with_kind(data, kind):
    with pytest.raises(DeviceOutputError) as e:
        parse_dump(data, SCREEN)
    assert e.value.kind == kind
    assert kind in str(e.value)


@pytest.mark.parametrize(
    "bounds",
    ["[2000,0][2100,10]", "[0,-50][100,-10]", "[10,10][10,50]", "[50,50][40,60]", "[1080,2400][1200,2500]"],
)
def test_bounds_outside_or_empty_are_dropped(bounds):
    xml = f"<hierarchy><node text='a' clickable='true' bounds='{bounds}'/></hierarchy>"
    assert parse_dump(xml, SCREEN) == []


def test_negative_bounds_are_clipped():
    (el,) = parse_dump("<hierarchy><node text='a' bounds='[-10,-20][30,40]'/></hierarchy>", SCREEN)
    assert el.bounds == (0, 0, 30, 40)


def test_parse_bounds():
    assert parse_bounds(" [1,2][3,4] ") == (1, 2, 3, 4)
    with pytest.raises(DeviceOutputError):
        parse_bounds("1,2,3,4")


def test_too_large():
    data = b"<hierarchy>" + b" " * MAX_XML_BYTES + b"</hierarchy>"
    with pytest.raises(DeviceOutputError) as e:
        parse_dump(data, SCREEN)
    assert e.value.kind == "too_large"


def test_too_deep():
    depth = MAX_DEPTH + 5
    data = "<hierarchy>" + "<node bounds='[0,0][1,1]'>" * depth + "</node>" * depth + "</hierarchy>"
    with pytest.raises(DeviceOutputError) as e:
        parse_dump(data, SCREEN)
    assert e.value.kind == "too_deep"


def test_too_many_nodes():
    data = "<hierarchy>" + "<node text='a' bounds='[0,0][1,1]'/>" * (MAX_NODES + 1) + "</hierarchy>"
    with pytest.raises(DeviceOutputError) as e:
        parse_dump(data, SCREEN)
    assert e.value.kind == "too_many_nodes"
